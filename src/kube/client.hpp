// A small Kubernetes REST client (libcurl): kubeconfig or in-cluster credentials, JSON requests and
// watch streams. Behind the KubeClient seam so the doctor and the autoscaler are tested against a
// test API server. Facts: docs/autoscale.md.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "common/error.hpp"
#include "common/hostfs.hpp"

namespace gpufence {

// An HTTP answer as it came: the status and the body (a Status object on errors; null when the
// body was empty or not JSON).
struct KubeResponse {
  long status = 0;
  nlohmann::json body;
};

// Called with each line of a watch stream (one JSON event per line); false ends the stream.
using LineHandler = std::function<bool(std::string_view line)>;

class KubeClient {
 public:
  virtual ~KubeClient() = default;
  // `method` ("GET", "PUT", "POST", "PATCH": a strategic merge patch) on `path`
  // ("/api/v1/nodes/x") with a JSON `body`; the
  // answer whatever its status. Errors only when no HTTP answer came (connection, TLS).
  virtual Result<KubeResponse> call(const std::string& method, const std::string& path,
                                    const std::string& body = "") = 0;
  // A GET whose body is streamed line by line (?watch=1): returns when the server ends the
  // stream, `on_line` returns false, `stop` becomes true, or `max_duration` passes. A non-2xx
  // answer is returned with its Status body and no line is handed out.
  virtual Result<KubeResponse> stream(const std::string& path, const LineHandler& on_line,
                                      const std::atomic<bool>& stop,
                                      std::chrono::seconds max_duration) = 0;
  // `call`, with non-2xx answers as errors naming the status and path (409 is Errc::conflict).
  Result<nlohmann::json> request(const std::string& method, const std::string& path,
                                 const std::string& body = "");
  Result<nlohmann::json> get(const std::string& path) { return request("GET", path); }
};

struct KubeCredentials {
  std::string server;  // https://host:port
  std::string ca_pem;  // empty: system CAs
  std::string client_cert_pem, client_key_pem;
  std::string token;
  // Where `token` came from, when from a file: re-read whenever the file changes, since projected
  // service-account tokens are rotated by the kubelet (hourly by default) and the old one stops
  // working when it expires (docs/autoscale.md, "Credentials").
  std::string token_file;
  bool insecure_skip_verify = false;
};

// From a kubeconfig's current context (certificate-authority[-data], client-certificate[-data],
// client-key[-data], token[-file], insecure-skip-tls-verify). Relative files resolve against the
// kubeconfig's directory.
Result<KubeCredentials> credentials_from_kubeconfig(std::string_view text, const std::string& path);
// In a pod: $KUBERNETES_SERVICE_HOST/_PORT and the service account's token and CA.
Result<KubeCredentials> credentials_in_cluster(const HostFs& pod_fs);

// The kubeconfig at `path` when given, else in-cluster credentials.
Result<KubeCredentials> load_credentials(const std::string& kubeconfig_path);

std::unique_ptr<KubeClient> make_rest_client(KubeCredentials credentials);

// A query parameter value, percent-encoded (label and field selectors, continue tokens).
std::string url_escape(std::string_view s);

}  // namespace gpufence
