// Mutual TLS credentials and the role check in front of every rpc (ifec/live/tls.h).
#include "ifec/live/tls.h"

#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>

#include "ifec/common/checks.h"
#include "ifec/v1/control.grpc.pb.h"

namespace ifec::live {

namespace {

constexpr const char* kRoleProperty = "ifec_role";
constexpr const char* kQualifierProperty = "ifec_qualifier";

constexpr const char* kTlsHint =
    "certificates: --tls-dir DIR holding ca.pem, NAME.pem and NAME.key, made by the "
    "bring-up; or --insecure";

// A PEM file's text. A folder, an empty file or one without a PEM block is named here: gRPC takes any text and
// then fails to build the server, which the daemon could only report as an address it cannot listen on.
std::string read_file(const std::string& path) {
  std::error_code ec;
  IFEC_CHECK(!std::filesystem::is_directory(path, ec), path << " is a directory, not a PEM file (" << kTlsHint << ")");
  std::ifstream in(path);
  IFEC_CHECK(in.good(), "cannot read " << path << " (" << kTlsHint << ")");
  std::stringstream s;
  s << in.rdbuf();
  IFEC_CHECK(s.str().find("-----BEGIN ") != std::string::npos,
             path << " holds no PEM block (" << s.str().size() << " B without '-----BEGIN '; " << kTlsHint << ")");
  return s.str();
}

struct Files {
  std::string ca, cert, key;
};

Files load(const TlsConfig& tls) {
  IFEC_CHECK(!tls.dir.empty(), "no certificates: give --tls-dir DIR (the bring-up makes one) or --insecure");
  const std::string base = tls.dir + "/" + tls.name;
  return {read_file(tls.dir + "/ca.pem"), read_file(base + ".pem"), read_file(base + ".key")};
}

std::string first_value(const grpc::AuthContext& ctx, const char* name) {
  const auto v = ctx.FindPropertyValues(name);
  return v.empty() ? "" : std::string(v.front().data(), v.front().size());
}

// "/ifec.v1.Switch/SetLoss" -> "Switch.SetLoss".
std::string rpc_name(const std::string& path) {
  const size_t slash = path.rfind('/');
  const size_t dot = path.rfind('.', slash);
  return slash == std::string::npos || dot == std::string::npos
             ? path
             : path.substr(dot + 1, slash - dot - 1) + "." + path.substr(slash + 1);
}

std::string joined(const std::set<std::string>& s) {
  std::string out;
  for (const std::string& x : s) {
    out += (out.empty() ? "" : ", ") + x;
  }
  return out;
}

}  // namespace

Identity parse_identity(const std::string& cn) {
  Identity id;
  const size_t colon = cn.find(':');
  const std::string role = cn.substr(0, colon);
  const std::string qual = colon == std::string::npos ? "" : cn.substr(colon + 1);
  if ((role == "viewer" || role == "operator") && colon == std::string::npos) {
    id.role = role;
  } else if (role == "daemon" && !qual.empty()) {
    id.role = role;
    id.qualifier = qual;
  } else if (role == "rank" && !qual.empty()) {
    const std::string digits = qual.rfind("job", 0) == 0 ? qual.substr(3) : qual;
    if (!digits.empty() && digits.size() <= 9 && digits.find_first_not_of("0123456789") == std::string::npos &&
        std::stoul(digits) > 0) {
      id.role = role;
      id.qualifier = qual;
      id.job = static_cast<uint32_t>(std::stoul(digits));
    }
  }
  return id;
}

const std::map<std::string, std::set<std::string>>& rpc_roles() {
  static const std::map<std::string, std::set<std::string>> table = [] {
    std::map<std::string, std::set<std::string>> t;
    const google::protobuf::FileDescriptor* file = v1::Empty::descriptor()->file();
    for (int s = 0; s < file->service_count(); ++s) {
      const google::protobuf::ServiceDescriptor* service = file->service(s);
      for (int i = 0; i < service->method_count(); ++i) {
        const auto* m = service->method(i);
        std::set<std::string>& roles = t["/" + service->full_name() + "/" + m->name()];
        std::istringstream words(m->options().GetExtension(v1::roles));
        for (std::string r; words >> r;) {
          roles.insert(r);
        }
      }
    }
    return t;
  }();
  return table;
}

grpc::Status RoleAuthz::Process(const InputMetadata& md, grpc::AuthContext* ctx, OutputMetadata*, OutputMetadata*) {
  const auto path_it = md.find(":path");
  const std::string path = path_it == md.end() ? "" : std::string(path_it->second.data(), path_it->second.size());
  const std::string cn = first_value(*ctx, "x509_common_name");
  const Identity id = parse_identity(cn);
  const auto& table = rpc_roles();
  const auto allowed = table.find(path);
  if (allowed == table.end()) {
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED, "no rpc " + path + " in the roles table");
  }
  if (id.role.empty()) {
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                        "certificate CN='" + cn + "' names no role (viewer, operator, rank:JOB, daemon:NODE): " +
                            rpc_name(path) + " refused");
  }
  if (allowed->second.count(id.role) == 0) {
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED, "role " + id.role + " (certificate CN='" + cn +
                                                                 "') may not call " + rpc_name(path) +
                                                                 " (allowed: " + joined(allowed->second) + ")");
  }
  ctx->AddProperty(kRoleProperty, id.role);
  ctx->AddProperty(kQualifierProperty, id.qualifier);
  return grpc::Status::OK;
}

Identity caller_identity(const grpc::ServerContext* ctx) {
  const std::shared_ptr<const grpc::AuthContext> auth = ctx->auth_context();
  if (!auth || first_value(*auth, kRoleProperty).empty()) {
    return {};
  }
  const std::string q = first_value(*auth, kQualifierProperty);
  return parse_identity(first_value(*auth, kRoleProperty) + (q.empty() ? "" : ":" + q));
}

std::shared_ptr<grpc::ServerCredentials> server_credentials(const TlsConfig& tls) {
  if (tls.insecure) {
    return grpc::InsecureServerCredentials();
  }
  const Files f = load(tls);
  grpc::SslServerCredentialsOptions o(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  o.pem_root_certs = f.ca;
  o.pem_key_cert_pairs.push_back({f.key, f.cert});
  std::shared_ptr<grpc::ServerCredentials> creds = grpc::SslServerCredentials(o);
  creds->SetAuthMetadataProcessor(std::make_shared<RoleAuthz>());
  return creds;
}

std::shared_ptr<grpc::ChannelCredentials> channel_credentials(const TlsConfig& tls) {
  if (tls.insecure) {
    return grpc::InsecureChannelCredentials();
  }
  const Files f = load(tls);
  grpc::SslCredentialsOptions o;
  o.pem_root_certs = f.ca;
  o.pem_private_key = f.key;
  o.pem_cert_chain = f.cert;
  return grpc::SslCredentials(o);
}

namespace {
std::mutex g_process_mu;
std::shared_ptr<grpc::ChannelCredentials> g_process_creds;
}  // namespace

void set_process_tls(const TlsConfig& tls) {
  auto creds = channel_credentials(tls);
  std::lock_guard<std::mutex> lock(g_process_mu);
  g_process_creds = std::move(creds);
}

std::shared_ptr<grpc::ChannelCredentials> process_channel_credentials() {
  std::lock_guard<std::mutex> lock(g_process_mu);
  return g_process_creds ? g_process_creds : grpc::InsecureChannelCredentials();
}

}  // namespace ifec::live
