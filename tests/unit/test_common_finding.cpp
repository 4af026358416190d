// A finding in its two printed forms (common/finding.hpp): the text block and the JSON object
// that the doctor's report and `gpufence setup check-containerd --json` both print. A finding's
// fields carry bytes from configs and pods: the JSON stays valid, the text stays one line each.
#include <gtest/gtest.h>

#include "common/finding.hpp"
#include "support/test_support.hpp"

using namespace gpufence;

namespace {

Finding hostile_finding() {
  // What a pod or a RuntimeClass can put into a field: a quote and brace that would close the
  // object early, ESC and CR LF that drive a terminal or forge a line, and bytes that are not
  // UTF-8.
  return Finding{"containerd.handler-missing", Severity::error,
                 std::string("handler 'nv\xff\xfe\"}' has no runtime"),
                 std::string("read \x1b[2J\r\n- [gpu.ok] forged"), "add \"nvidia\""};
}

std::vector<std::string> keys(const nlohmann::ordered_json& j) {
  std::vector<std::string> out;
  for (const auto& [k, v] : j.items()) out.push_back(k);
  return out;
}

const std::vector<std::string> kFindingKeys = {"id", "severity", "summary", "evidence", "fix"};

}  // namespace

// The shape docs/doctor.md documents, keys in that order.
TEST(FindingJson, IsTheDocumentedObjectInTheDocumentedOrder) {
  Finding f{"gpu.shared", Severity::warning, "two use GPU 0", "pids 1, 2", "set exclusive"};
  EXPECT_EQ(finding_json(f).dump(),
            R"({"id":"gpu.shared","severity":"warning","summary":"two use GPU 0",)"
            R"("evidence":"pids 1, 2","fix":"set exclusive"})");
  auto arr = findings_json({f, hostile_finding()});
  ASSERT_EQ(arr.size(), 2u);
  EXPECT_EQ(arr[0], finding_json(f));
  EXPECT_EQ(arr[1]["severity"], "error");
  EXPECT_TRUE(findings_json({}).is_array());
}

// nlohmann's default dump throws on bytes that are not UTF-8 (type_error 316): check-containerd's
// --json ended in an exception on such a handler name. report_json_text prints them.
TEST(FindingJson, PodBytesKeepTheReportValidAsciiJson) {
  nlohmann::ordered_json doc{{"findings", findings_json({hostile_finding()})}};
  EXPECT_ANY_THROW((void)doc.dump(2)) << "control: the dump setup used to print";
  std::string text;
  ASSERT_NO_THROW(text = report_json_text(doc));
  for (unsigned char ch : text) ASSERT_LT(ch, 0x80) << "non-ASCII byte in " << text;
  for (char ch : {'\x1b', '\r'}) EXPECT_EQ(text.find(ch), std::string::npos) << text;
  ASSERT_EQ(text.back(), '\n');
  auto back = nlohmann::ordered_json::parse(text);
  ASSERT_EQ(back["findings"].size(), 1u);
  EXPECT_EQ(keys(back["findings"][0]), kFindingKeys);
  // Not UTF-8: each byte becomes U+FFFD; the rest is kept as it was.
  EXPECT_EQ(back["findings"][0]["summary"],
            "handler 'nv\xef\xbf\xbd\xef\xbf\xbd\"}' has no runtime");
  EXPECT_EQ(back["findings"][0]["evidence"], "read \x1b[2J\r\n- [gpu.ok] forged");
}

// The text form of the same finding: one escaped line per field, no forged finding line.
TEST(FindingText, PodBytesStayOnTheirLine) {
  std::string text = finding_text(hostile_finding());
  EXPECT_EQ(text.find('\x1b'), std::string::npos) << text;
  EXPECT_EQ(text.find("\n- [gpu.ok]"), std::string::npos) << text;
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 3) << text;
}

// check-containerd prints the same objects as the doctor: a handler name from the command line
// (a RuntimeClass's, any bytes) reached nlohmann's default dump, which threw; and its keys came
// out sorted (nlohmann::json), not in the documented order.
TEST(FindingJson, CheckContainerdPrintsTheReportsFindings) {
  test::TempDir dir;
  auto config = dir.write("config.toml", "version = 2\n");
  const std::string handler = "nv\xff\x1b[2J\"}";
  auto r = test::run_command({test::bin_path("gpufence"), "setup", "check-containerd", "--json",
                              "--config", config.string(), "--handler", handler});
  ASSERT_EQ(r.exit_code, 1) << r.out << r.err;
  for (unsigned char ch : r.out) ASSERT_LT(ch, 0x80) << "non-ASCII byte in " << r.out;
  auto doc = nlohmann::ordered_json::parse(r.out);
  EXPECT_EQ(keys(doc), (std::vector<std::string>{"config", "version", "findings"}));
  EXPECT_EQ(doc["config"], config.string());
  EXPECT_EQ(doc["version"], 2);
  ASSERT_FALSE(doc["findings"].empty());
  bool named = false;
  for (const auto& f : doc["findings"]) {
    EXPECT_EQ(keys(f), kFindingKeys) << f.dump();
    if (f["id"] == "containerd.handler-missing")
      named |=
          f["summary"].get<std::string>().find("nv\xef\xbf\xbd\x1b[2J\"}") != std::string::npos;
  }
  EXPECT_TRUE(named) << r.out;
}
