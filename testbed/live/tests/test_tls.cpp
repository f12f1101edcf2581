// The control plane's identities and roles table (ifec/live/tls.h); the daemons enforcing them over real TLS are
// bindings/tests/test_live_security.py.
#include <gtest/gtest.h>

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

}  // namespace
}  // namespace ifec
