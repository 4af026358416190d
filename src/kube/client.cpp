#include "kube/client.hpp"

#include <curl/curl.h>
#include <yaml-cpp/yaml.h>

#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <mutex>

#include "common/file.hpp"
#include "common/strings.hpp"

namespace gpufence {
namespace {

std::string base64_decode(std::string_view in) {
  static const std::string chars =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  int val = 0, bits = -8;
  for (char c : in) {
    auto pos = chars.find(c);
    if (pos == std::string::npos) continue;  // '=' padding and whitespace
    val = (val << 6) + static_cast<int>(pos);
    bits += 6;
    if (bits >= 0) {
      out.push_back(static_cast<char>((val >> bits) & 0xFF));
      bits -= 8;
    }
  }
  return out;
}

// "<key>-data" inline (base64), else "<key>" as a file path.
Result<std::string> data_or_file(const YAML::Node& node, const std::string& key,
                                 const std::filesystem::path& base) {
  if (node[key + "-data"]) return base64_decode(node[key + "-data"].as<std::string>());
  if (node[key]) {
    std::filesystem::path p = node[key].as<std::string>();
    if (p.is_relative()) p = base / p;
    auto text = read_file(p);
    if (!text) return std::unexpected(text.error().wrap("kubeconfig " + key));
    return *text;
  }
  return std::string();
}

YAML::Node named(const YAML::Node& list, const std::string& name, const std::string& field) {
  if (!list || !list.IsSequence()) return {};
  for (const auto& item : list) {
    if (item["name"] && item["name"].as<std::string>() == name) return item[field];
  }
  return {};
}

size_t collect(char* data, size_t size, size_t n, void* out) {
  static_cast<std::string*>(out)->append(data, size * n);
  return size * n;
}

// The state of one streamed GET: complete lines go to the handler, an error answer's body is kept.
struct StreamState {
  CURL* curl = nullptr;
  const LineHandler* on_line = nullptr;
  const std::atomic<bool>* stop = nullptr;
  std::string pending;  // a line not yet complete, or an error answer's body
  bool handler_ended = false;
};

size_t stream_lines(char* data, size_t size, size_t n, void* user) {
  auto* st = static_cast<StreamState*>(user);
  long status = 0;
  curl_easy_getinfo(st->curl, CURLINFO_RESPONSE_CODE, &status);
  st->pending.append(data, size * n);
  if (status < 200 || status >= 300) return size * n;  // a Status body: kept whole
  size_t start = 0;
  for (size_t nl; (nl = st->pending.find('\n', start)) != std::string::npos; start = nl + 1) {
    std::string_view line(st->pending.data() + start, nl - start);
    if (!line.empty() && !(*st->on_line)(line)) {
      st->handler_ended = true;
      return 0;  // ends the transfer (CURLE_WRITE_ERROR), as asked
    }
  }
  st->pending.erase(0, start);
  return size * n;
}

int stream_progress(void* user, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  return static_cast<StreamState*>(user)->stop->load() ? 1 : 0;  // nonzero aborts the transfer
}

// The token as it is now: re-read from its file when the file changed (the kubelet swaps a
// projected token's ..data symlink, so the target's inode and mtime change).
class TokenSource {
 public:
  TokenSource(std::string token, std::string file)
      : m_token(std::move(token)), m_file(std::move(file)) {
    if (!m_file.empty()) refresh(Force::yes);
  }
  enum class Force { no, yes };
  std::string current(Force force = Force::no) {
    std::lock_guard lock(m_mu);
    if (!m_file.empty()) refresh(force);
    return m_token;
  }
  bool from_file() const { return !m_file.empty(); }

 private:
  void refresh(Force force) {
    struct stat st {};
    if (::stat(m_file.c_str(), &st) != 0) return;  // keep the last good token; the API says 401
    bool same = st.st_ino == m_ino && st.st_mtim.tv_sec == m_mtime.tv_sec &&
                st.st_mtim.tv_nsec == m_mtime.tv_nsec && st.st_size == m_size;
    if (same && force == Force::no) return;
    auto text = read_file(m_file);
    if (!text) return;
    m_token = std::string(trim(*text));
    m_ino = st.st_ino;
    m_mtime = st.st_mtim;
    m_size = st.st_size;
  }
  std::mutex m_mu;
  std::string m_token, m_file;
  ino_t m_ino = 0;
  timespec m_mtime{};
  off_t m_size = -1;
};

class RestClient final : public KubeClient {
 public:
  explicit RestClient(KubeCredentials c) : m_c(std::move(c)), m_token(m_c.token, m_c.token_file) {}

  Result<KubeResponse> call(const std::string& method, const std::string& path,
                            const std::string& request_body) override {
    auto answer = call_once(method, path, request_body, TokenSource::Force::no);
    // A 401 with a file-backed token: the file may have been rotated within the stat's
    // granularity; read it again and retry once.
    if (answer && answer->status == 401 && m_token.from_file())
      answer = call_once(method, path, request_body, TokenSource::Force::yes);
    return answer;
  }

  Result<KubeResponse> stream(const std::string& path, const LineHandler& on_line,
                              const std::atomic<bool>& stop,
                              std::chrono::seconds max_duration) override {
    CURL* curl = curl_easy_init();
    if (!curl) return fail(Errc::rpc, "curl_easy_init failed");
    StreamState st{curl, &on_line, &stop, {}, false};
    std::string url = m_c.server + path;
    curl_slist* headers = setup(curl, "GET", url, "", TokenSource::Force::no);
    curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, stream_lines);
    curl_easy_setopt(curl, CURLOPT_WRITEDATA, &st);
    curl_easy_setopt(curl, CURLOPT_TIMEOUT, static_cast<long>(max_duration.count()));
    curl_easy_setopt(curl, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(curl, CURLOPT_XFERINFOFUNCTION, stream_progress);
    curl_easy_setopt(curl, CURLOPT_XFERINFODATA, &st);
    CURLcode rc = curl_easy_perform(curl);
    long status = 0;
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
    curl_slist_free_all(headers);
    curl_easy_cleanup(curl);
    bool ended_by_us = (rc == CURLE_WRITE_ERROR && st.handler_ended) ||
                       rc == CURLE_ABORTED_BY_CALLBACK || rc == CURLE_OPERATION_TIMEDOUT;
    if (rc != CURLE_OK && !(ended_by_us && status != 0))
      return fail(Errc::rpc, "GET ", url, ": ", curl_easy_strerror(rc));
    KubeResponse out{status, nullptr};
    if (status < 200 || status >= 300) out.body = nlohmann::json::parse(st.pending, nullptr, false);
    if (out.body.is_discarded()) out.body = nullptr;
    return out;
  }

 private:
  // The options every request shares: URL, method, headers (token included), TLS.
  curl_slist* setup(CURL* curl, const std::string& method, const std::string& url,
                    const std::string& request_body, TokenSource::Force force) {
    curl_slist* headers = curl_slist_append(nullptr, "Accept: application/json");
    // A PATCH is a strategic merge patch: lists with a merge key (a Node's status.conditions,
    // by type) keep the entries the patch does not name, as kubectl and the kubelet patch.
    if (!request_body.empty())
      headers = curl_slist_append(
          headers, method == "PATCH" ? "Content-Type: application/strategic-merge-patch+json"
                                     : "Content-Type: application/json");
    std::string token = m_token.current(force);
    if (!token.empty())
      headers = curl_slist_append(headers, ("Authorization: Bearer " + token).c_str());
    curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
    curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, method.c_str());
    if (!request_body.empty()) {
      curl_easy_setopt(curl, CURLOPT_POSTFIELDS, request_body.c_str());
      curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE, static_cast<long>(request_body.size()));
    }
    curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT, 10L);
    curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
    // CURL_BLOB_COPY: libcurl keeps its own copy, so these may go out of scope.
    curl_blob ca{m_c.ca_pem.data(), m_c.ca_pem.size(), CURL_BLOB_COPY};
    if (!m_c.ca_pem.empty()) curl_easy_setopt(curl, CURLOPT_CAINFO_BLOB, &ca);
    curl_blob cert{m_c.client_cert_pem.data(), m_c.client_cert_pem.size(), CURL_BLOB_COPY};
    curl_blob key{m_c.client_key_pem.data(), m_c.client_key_pem.size(), CURL_BLOB_COPY};
    if (!m_c.client_cert_pem.empty()) {
      curl_easy_setopt(curl, CURLOPT_SSLCERT_BLOB, &cert);
      curl_easy_setopt(curl, CURLOPT_SSLCERTTYPE, "PEM");
      curl_easy_setopt(curl, CURLOPT_SSLKEY_BLOB, &key);
      curl_easy_setopt(curl, CURLOPT_SSLKEYTYPE, "PEM");
    }
    if (m_c.insecure_skip_verify) {
      curl_easy_setopt(curl, CURLOPT_SSL_VERIFYPEER, 0L);
      curl_easy_setopt(curl, CURLOPT_SSL_VERIFYHOST, 0L);
    }
    return headers;
  }

  Result<KubeResponse> call_once(const std::string& method, const std::string& path,
                                 const std::string& request_body, TokenSource::Force force) {
    CURL* curl = curl_easy_init();
    if (!curl) return fail(Errc::rpc, "curl_easy_init failed");
    std::string body, url = m_c.server + path;
    curl_slist* headers = setup(curl, method, url, request_body, force);
    curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, collect);
    curl_easy_setopt(curl, CURLOPT_WRITEDATA, &body);
    curl_easy_setopt(curl, CURLOPT_TIMEOUT, 10L);
    CURLcode rc = curl_easy_perform(curl);
    long status = 0;
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
    curl_slist_free_all(headers);
    curl_easy_cleanup(curl);
    if (rc != CURLE_OK) return fail(Errc::rpc, method, " ", url, ": ", curl_easy_strerror(rc));
    KubeResponse out{status, nlohmann::json::parse(body, nullptr, false)};
    if (out.body.is_discarded()) {
      if (status >= 200 && status < 300)
        return fail(Errc::parse, method, " ", url, ": answer is not JSON");
      out.body = nullptr;
    }
    return out;
  }

  KubeCredentials m_c;
  TokenSource m_token;
};

}  // namespace

Result<KubeCredentials> credentials_from_kubeconfig(std::string_view text,
                                                    const std::string& path) {
  try {
    YAML::Node doc = YAML::Load(std::string(text));
    std::string context = doc["current-context"] ? doc["current-context"].as<std::string>() : "";
    if (context.empty()) return fail(Errc::parse, path, ": no current-context");
    YAML::Node ctx = named(doc["contexts"], context, "context");
    if (!ctx) return fail(Errc::parse, path, ": context '", context, "' not found");
    std::string cluster_name = ctx["cluster"] ? ctx["cluster"].as<std::string>() : "";
    std::string user_name = ctx["user"] ? ctx["user"].as<std::string>() : "";
    YAML::Node cluster = named(doc["clusters"], cluster_name, "cluster");
    if (!cluster || !cluster["server"])
      return fail(Errc::parse, path, ": cluster '", cluster_name, "' has no server");
    std::filesystem::path base = std::filesystem::path(path).parent_path();
    KubeCredentials c;
    c.server = cluster["server"].as<std::string>();
    while (!c.server.empty() && c.server.back() == '/') c.server.pop_back();
    c.insecure_skip_verify =
        cluster["insecure-skip-tls-verify"] && cluster["insecure-skip-tls-verify"].as<bool>();
    auto ca = data_or_file(cluster, "certificate-authority", base);
    if (!ca) return std::unexpected(ca.error());
    c.ca_pem = *ca;
    if (YAML::Node user = named(doc["users"], user_name, "user")) {
      auto cert = data_or_file(user, "client-certificate", base);
      auto key = data_or_file(user, "client-key", base);
      if (!cert) return std::unexpected(cert.error());
      if (!key) return std::unexpected(key.error());
      c.client_cert_pem = *cert;
      c.client_key_pem = *key;
      if (user["token"])
        c.token = user["token"].as<std::string>();
      else if (user["tokenFile"]) {
        std::filesystem::path file = user["tokenFile"].as<std::string>();
        if (file.is_relative()) file = base / file;
        auto t = read_file(file);
        if (!t) return std::unexpected(t.error());
        c.token = std::string(trim(*t));
        c.token_file = file.string();
      }
    }
    return c;
  } catch (const YAML::Exception& e) {
    return fail(Errc::parse, path, ": ", e.what());
  }
}

Result<KubeCredentials> credentials_in_cluster(const HostFs& pod_fs) {
  const char* host = std::getenv("KUBERNETES_SERVICE_HOST");
  const char* port = std::getenv("KUBERNETES_SERVICE_PORT");
  if (!host || !port)
    return fail(Errc::not_found,
                "not in a pod: KUBERNETES_SERVICE_HOST/PORT unset (use --kubeconfig)");
  const std::string sa = "/var/run/secrets/kubernetes.io/serviceaccount";
  auto token = pod_fs.read(sa + "/token");
  if (!token) return std::unexpected(token.error().wrap("service account token"));
  auto ca = pod_fs.read(sa + "/ca.crt");
  if (!ca) return std::unexpected(ca.error().wrap("service account CA"));
  KubeCredentials c;
  std::string h = host;
  c.server = "https://" + (h.find(':') != std::string::npos ? "[" + h + "]" : h) + ":" + port;
  c.token = std::string(trim(*token));
  c.token_file = pod_fs.resolve(sa + "/token").string();
  c.ca_pem = *ca;
  return c;
}

Result<KubeCredentials> load_credentials(const std::string& kubeconfig_path) {
  if (kubeconfig_path.empty()) return credentials_in_cluster(HostFs("/"));
  auto text = read_file(kubeconfig_path);
  if (!text) return std::unexpected(text.error());
  return credentials_from_kubeconfig(*text, kubeconfig_path);
}

Result<nlohmann::json> KubeClient::request(const std::string& method, const std::string& path,
                                           const std::string& body) {
  auto answer = call(method, path, body);
  if (!answer) return std::unexpected(answer.error());
  if (answer->status >= 200 && answer->status < 300) return std::move(answer->body);
  std::string reason =
      answer->body.is_object() ? answer->body.value("message", std::string()) : std::string();
  return fail(answer->status == 409 ? Errc::conflict : Errc::rpc, method, " ", path, ": HTTP ",
              answer->status, reason.empty() ? "" : " (" + reason + ")");
}

std::string url_escape(std::string_view s) {
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~')
      out += static_cast<char>(c);
    else
      out += cat("%", "0123456789ABCDEF"[c >> 4], "0123456789ABCDEF"[c & 15]);
  }
  return out;
}

std::unique_ptr<KubeClient> make_rest_client(KubeCredentials credentials) {
  static const bool initialised = curl_global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK;
  (void)initialised;
  return std::make_unique<RestClient>(std::move(credentials));
}

}  // namespace gpufence
