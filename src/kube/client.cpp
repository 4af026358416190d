#include "kube/client.hpp"

#include <curl/curl.h>
#include <yaml-cpp/yaml.h>

#include <cstdlib>
#include <filesystem>

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

class RestClient final : public KubeClient {
 public:
  explicit RestClient(KubeCredentials c) : m_c(std::move(c)) {}

  Result<nlohmann::json> request(const std::string& method, const std::string& path,
                                 const std::string& request_body) override {
    CURL* curl = curl_easy_init();
    if (!curl) return fail(Errc::rpc, "curl_easy_init failed");
    std::string body, url = m_c.server + path;
    curl_slist* headers = curl_slist_append(nullptr, "Accept: application/json");
    if (!request_body.empty())
      headers = curl_slist_append(headers, "Content-Type: application/json");
    if (!m_c.token.empty())
      headers = curl_slist_append(headers, ("Authorization: Bearer " + m_c.token).c_str());
    curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
    curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, method.c_str());
    if (!request_body.empty()) {
      curl_easy_setopt(curl, CURLOPT_POSTFIELDS, request_body.c_str());
      curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE, static_cast<long>(request_body.size()));
    }
    curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, collect);
    curl_easy_setopt(curl, CURLOPT_WRITEDATA, &body);
    curl_easy_setopt(curl, CURLOPT_TIMEOUT, 10L);
    curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
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
    CURLcode rc = curl_easy_perform(curl);
    long status = 0;
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
    curl_slist_free_all(headers);
    curl_easy_cleanup(curl);
    if (rc != CURLE_OK) return fail(Errc::rpc, method, " ", url, ": ", curl_easy_strerror(rc));
    if (status < 200 || status >= 300) {
      std::string reason;
      try {
        reason = nlohmann::json::parse(body).value("message", "");
      } catch (const nlohmann::json::exception&) {
      }
      return fail(status == 409 ? Errc::conflict : Errc::rpc, method, " ", url, ": HTTP ", status,
                  reason.empty() ? "" : " (" + reason + ")");
    }
    try {
      return nlohmann::json::parse(body);
    } catch (const nlohmann::json::exception& e) {
      return fail(Errc::parse, method, " ", url, ": answer is not JSON: ", e.what());
    }
  }

 private:
  KubeCredentials m_c;
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
        auto t = read_file(user["tokenFile"].as<std::string>());
        if (!t) return std::unexpected(t.error());
        c.token = std::string(trim(*t));
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
  c.ca_pem = *ca;
  return c;
}

Result<KubeCredentials> load_credentials(const std::string& kubeconfig_path) {
  if (kubeconfig_path.empty()) return credentials_in_cluster(HostFs("/"));
  auto text = read_file(kubeconfig_path);
  if (!text) return std::unexpected(text.error());
  return credentials_from_kubeconfig(*text, kubeconfig_path);
}

long resource_quantity(const nlohmann::json& list, const std::string& key) {
  if (!list.is_object() || !list.contains(key)) return 0;
  const auto& v = list[key];
  if (v.is_number_integer()) return v.get<long>();
  if (v.is_string()) return parse_number<long>(v.get<std::string>()).value_or(0);
  return 0;
}

std::unique_ptr<KubeClient> make_rest_client(KubeCredentials credentials) {
  static const bool initialised = curl_global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK;
  (void)initialised;
  return std::make_unique<RestClient>(std::move(credentials));
}

}  // namespace gpufence
