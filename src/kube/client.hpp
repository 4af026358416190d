// A small Kubernetes REST client (libcurl): kubeconfig or in-cluster credentials, GET of JSON.
// Behind the KubeClient seam so the doctor is tested against a test API server.
#pragma once

#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "common/error.hpp"
#include "common/hostfs.hpp"

namespace gpufence {

class KubeClient {
 public:
  virtual ~KubeClient() = default;
  // `method` ("GET", "PUT") on `path` ("/api/v1/nodes/x") with a JSON `body`; non-2xx answers
  // are errors naming the status and path (409 is Errc::conflict).
  virtual Result<nlohmann::json> request(const std::string& method, const std::string& path,
                                         const std::string& body = "") = 0;
  Result<nlohmann::json> get(const std::string& path) { return request("GET", path); }
};

struct KubeCredentials {
  std::string server;  // https://host:port
  std::string ca_pem;  // empty: system CAs
  std::string client_cert_pem, client_key_pem;
  std::string token;
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

// A resource quantity as the API writes it in capacity/allocatable/limits ("2" or 2); 0 when
// absent or not a whole number (extended resources such as nvidia.com/gpu are whole numbers).
long resource_quantity(const nlohmann::json& list, const std::string& key);

}  // namespace gpufence
