// The control plane's mutual TLS and role-based authorization (docs/architecture.md, "Security").
//
// Every daemon serves gRPC with TLS, requires a client certificate signed by the testbed's CA and maps the
// certificate's subject common name to a role (viewer, operator, rank:JOB, daemon:NODE). Which roles may call an rpc
// is the `roles` option of that rpc in control.proto, the one table; RoleAuthz enforces it before any handler runs
// and refuses anything else with PERMISSION_DENIED naming the role and the rpc. Clients present a certificate of
// their own: a daemon its NODE.pem when it calls another daemon, the torch backend rank.pem, the Python package the
// role each rpc needs. A folder of certificates (ifec.pki makes one at bring-up) holds ca.pem and NAME.pem/NAME.key.
#pragma once

#include <grpcpp/grpcpp.h>
#include <grpcpp/security/auth_metadata_processor.h>

#include <map>
#include <memory>
#include <set>
#include <string>

namespace ifec::live {

// Where a process finds its certificates: `dir` holds ca.pem and `name`.pem / `name`.key. insecure: plaintext, no
// certificates, no roles (every caller may do everything: the daemons say so loudly at start).
struct TlsConfig {
  std::string dir;
  std::string name;
  bool insecure = false;
};

// A certificate's identity as the daemons read it: its role and what qualifies it (daemon: the node; rank: the job).
struct Identity {
  std::string role;  // viewer | operator | rank | daemon ("" if the name is none of them)
  std::string qualifier;
  uint32_t job = 0;  // rank: its job
};
// Parses "viewer", "operator", "rank:JOB" (JOB a positive number, or "jobJOB"), "daemon:NODE".
Identity parse_identity(const std::string& common_name);

// The roles each rpc may be called by, from control.proto's `roles` options: "/ifec.v1.Switch/SetLoss" -> roles.
const std::map<std::string, std::set<std::string>>& rpc_roles();

// Server side: TLS requiring and verifying client certificates, RoleAuthz in front of every call; throws
// common::Error naming a missing or unreadable file. Insecure: plaintext.
std::shared_ptr<grpc::ServerCredentials> server_credentials(const TlsConfig& tls);
// Client side: presents `tls.name`'s certificate and trusts only the folder's CA. Insecure: plaintext.
std::shared_ptr<grpc::ChannelCredentials> channel_credentials(const TlsConfig& tls);

// What this process's channels to daemons present (GrpcControl, GrpcBootstrap, responder resets): a daemon sets its
// own at start; plaintext until then. Thread-safe.
void set_process_tls(const TlsConfig& tls);
std::shared_ptr<grpc::ChannelCredentials> process_channel_credentials();

// The identity a daemon's server side authorized a call as (properties RoleAuthz adds to the call's auth context),
// or an empty Identity on an insecure server.
Identity caller_identity(const grpc::ServerContext* ctx);

// The authorization step: the caller's certificate name -> role -> the rpc's roles.
class RoleAuthz : public grpc::AuthMetadataProcessor {
 public:
  bool IsBlocking() const override { return false; }
  grpc::Status Process(const InputMetadata& auth_metadata, grpc::AuthContext* context,
                       OutputMetadata* consumed_auth_metadata, OutputMetadata* response_metadata) override;
};

}  // namespace ifec::live
