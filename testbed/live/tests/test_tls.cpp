// The control plane's identities and roles table (ifec/live/tls.h); the daemons enforcing them over real TLS are
// bindings/tests/test_live_security.py.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "ifec/live/tls.h"

namespace ifec {
namespace {

TEST(TlsIdentity, ParsesEachRoleAndRefusesAnythingElse) {
  EXPECT_EQ(live::parse_identity("viewer").role, "viewer");
  EXPECT_EQ(live::parse_identity("operator").role, "operator");
  const live::Identity d = live::parse_identity("daemon:gpu3");
  EXPECT_EQ(d.role, "daemon");
  EXPECT_EQ(d.qualifier, "gpu3");
  EXPECT_EQ(live::parse_identity("rank:7").job, 7u);
  EXPECT_EQ(live::parse_identity("rank:job12").job, 12u);
  for (const char* bad : {"", "intruder", "viewer:x", "daemon", "daemon:", "rank", "rank:0", "rank:-1", "rank:x",
                          "rank:1234567890", "Viewer", "operator:"}) {
    EXPECT_EQ(live::parse_identity(bad).role, "") << bad;
  }
}

// Every rpc of both services is in the table with at least one role, and only the four roles appear; the rows the
// security matrix leans on.
TEST(TlsRoles, EveryRpcHasRolesAndOnlyKnownOnes) {
  const auto& t = live::rpc_roles();
  EXPECT_EQ(t.size(), 13u + 12u);
  for (const auto& [path, roles] : t) {
    EXPECT_FALSE(roles.empty()) << path;
    for (const std::string& r : roles) {
      EXPECT_TRUE(r == "viewer" || r == "operator" || r == "rank" || r == "daemon") << path << ": " << r;
    }
  }
  EXPECT_EQ(t.at("/ifec.v1.Switch/SetLoss"), std::set<std::string>{"operator"});
  EXPECT_EQ(t.at("/ifec.v1.Switch/Reserve"), std::set<std::string>{"daemon"});
  EXPECT_EQ(t.at("/ifec.v1.Host/Run"), std::set<std::string>{"rank"});
  EXPECT_EQ(t.count("/ifec.v1.Host/Nothing"), 0u);
}

TEST(TlsCredentials, AMissingFolderIsNamed) {
  try {
    live::server_credentials({"/nonexistent-ifec-tls", "gpu0", false});
    FAIL() << "no error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent-ifec-tls/ca.pem"), std::string::npos) << e.what();
  }
  try {
    live::channel_credentials({"", "rank", false});
    FAIL() << "no error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("--insecure"), std::string::npos) << e.what();
  }
}

// A folder where a file should be, an empty file and one without a PEM block are each named: gRPC took any text, and
// the daemon then failed to build its server, reported as an address it could not listen on.
TEST(TlsCredentials, AFileThatIsNoPemIsNamed) {
  const std::string dir = "/tmp/ifec-test-tls-" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir + "/ca.pem");
  std::ofstream(dir + "/n.pem") << "-----BEGIN CERTIFICATE-----\n";
  std::ofstream(dir + "/n.key") << "";
  auto error = [&] {
    try {
      live::server_credentials({dir, "n", false});
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  EXPECT_NE(error().find(dir + "/ca.pem is a directory, not a PEM file"), std::string::npos) << error();
  std::filesystem::remove(dir + "/ca.pem");
  std::ofstream(dir + "/ca.pem") << "not a certificate";
  EXPECT_NE(error().find(dir + "/ca.pem holds no PEM block (17 B"), std::string::npos) << error();
  std::ofstream(dir + "/ca.pem") << "-----BEGIN CERTIFICATE-----\n";
  EXPECT_NE(error().find(dir + "/n.key holds no PEM block (0 B"), std::string::npos) << error();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace ifec
