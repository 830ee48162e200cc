// ClientOptions::FromEnv: what a worker's environment and flags say, and
// what it says when they are missing or wrong.
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tessera/client.h"

namespace tessera {
namespace {

constexpr const char* kVariables[] = {"TF_CONFIG",           "TESSERA_SECRET",
                                      "TESSERA_SECRET_FILE", "TESSERA_ALLOW_WEAK_SECRET",
                                      "TESSERA_TRANSPORT",   "TESSERA_LOG_LEVEL"};
constexpr const char* kSecret = "0123456789abcdef0123456789abcdef";
constexpr const char* kTfConfig =
    R"({"cluster": {"ps": ["10.0.0.1:2222", "10.0.0.2:2222"], "worker": ["10.0.0.3:2222",
        "10.0.0.4:2222"], "chief": ["10.0.0.5:2222"]}, "task": {"type": "worker", "index": 1}})";

// Each test starts from an environment without Tessera's variables, and
// leaves the process's environment as it found it.
class FromEnvTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* name : kVariables) {
      const char* value = std::getenv(name);
      if (value != nullptr) saved_[name] = value;
      unsetenv(name);
    }
  }
  void TearDown() override {
    for (const char* name : kVariables) {
      auto it = saved_.find(name);
      if (it == saved_.end()) {
        unsetenv(name);
      } else {
        setenv(name, it->second.c_str(), 1);
      }
    }
  }
  static Result<ClientOptions> FromArgs(std::vector<const char*> args) {
    args.insert(args.begin(), "trainer");
    return ClientOptions::FromEnv(static_cast<int>(args.size()), args.data());
  }

  std::map<std::string, std::string> saved_;
};

TEST_F(FromEnvTest, ReadsTfConfigSecretTransportAndLogLevel) {
  setenv("TF_CONFIG", kTfConfig, 1);
  setenv("TESSERA_SECRET", kSecret, 1);
  setenv("TESSERA_TRANSPORT", "ucx", 1);
  setenv("TESSERA_LOG_LEVEL", "warn", 1);
  auto options = ClientOptions::FromEnv();
  ASSERT_TRUE(options.ok()) << options.status().ToString();
  EXPECT_EQ(options->cluster.num_tasks("ps"), 2);
  EXPECT_EQ(options->cluster.num_workers(), 3);
  EXPECT_EQ(options->task.job, "worker");
  EXPECT_EQ(options->task.index, 1);
  EXPECT_EQ(*options->cluster.worker_rank(options->task), 2);  // after the chief
  EXPECT_EQ(options->secret, kSecret);
  EXPECT_EQ(options->transport, "ucx");
  EXPECT_FALSE(options->allow_weak_secret);
}

TEST_F(FromEnvTest, DefaultsToTcp) {
  setenv("TF_CONFIG", kTfConfig, 1);
  setenv("TESSERA_SECRET", kSecret, 1);
  auto options = ClientOptions::FromEnv();
  ASSERT_TRUE(options.ok()) << options.status().ToString();
  EXPECT_EQ(options->transport, "tcp");
}

TEST_F(FromEnvTest, Tf1FlagsTakeThePlaceOfTfConfig) {
  setenv("TF_CONFIG", kTfConfig, 1);
  setenv("TESSERA_SECRET", kSecret, 1);
  // Both spellings, among the trainer's own arguments.
  auto options = FromArgs({"--epochs=3", "--ps_hosts", "h1:1,h2:2", "--worker_hosts=h3:3,h4:4",
                           "--job_name=worker", "--task_index", "0", "data.csv"});
  ASSERT_TRUE(options.ok()) << options.status().ToString();
  EXPECT_EQ(options->cluster.num_tasks("ps"), 2);
  EXPECT_EQ(options->cluster.tasks("ps")[1].host, "h2");
  EXPECT_EQ(options->cluster.num_workers(), 2);
  EXPECT_EQ(options->task.index, 0);
  EXPECT_EQ(*options->cluster.worker_rank(options->task), 0);
}

TEST_F(FromEnvTest, ChiefHostsAloneAreWorkersEnough) {
  setenv("TESSERA_SECRET", kSecret, 1);
  auto options =
      FromArgs({"--ps_hosts=h1:1", "--chief_hosts=h0:1", "--job_name=chief", "--task_index=0"});
  ASSERT_TRUE(options.ok()) << options.status().ToString();
  EXPECT_EQ(options->cluster.chief().job, "chief");
}

TEST_F(FromEnvTest, NamesWhatIsMissingOrWrong) {
  setenv("TESSERA_SECRET", kSecret, 1);
  struct Case {
    std::vector<const char*> args;
    std::string expected;
  };
  const Case cases[] = {
      {{}, "set TF_CONFIG, or pass --ps_hosts"},
      {{"--job_name=worker", "--task_index=0", "--worker_hosts=h:1"}, "without --ps_hosts"},
      {{"--ps_hosts=h:1", "--task_index=0", "--worker_hosts=h:1"}, "without --job_name"},
      {{"--ps_hosts=h:1", "--job_name=worker", "--task_index=0"}, "without --worker_hosts"},
      {{"--ps_hosts=h:1", "--worker_hosts=h:2", "--job_name=worker", "--task_index=x"},
       "--task_index='x' is not an index"},
      {{"--ps_hosts=h:1", "--worker_hosts=h:2", "--job_name=worker", "--task_index=-1"},
       "--task_index='-1' is not an index"},
      {{"--ps_hosts=h:1", "--worker_hosts=h:2", "--job_name=worker", "--task_index=3"},
       "--job_name/--task_index"},
      {{"--ps_hosts=h", "--worker_hosts=h:2", "--job_name=worker", "--task_index=0"}, "h"},
      {{"--ps_hosts"}, "--ps_hosts has no value"},
  };
  for (const auto& c : cases) {
    auto options = FromArgs(c.args);
    ASSERT_FALSE(options.ok()) << c.expected;
    EXPECT_NE(options.status().message().find(c.expected), std::string::npos)
        << options.status().ToString() << " does not say " << c.expected;
  }
}

TEST_F(FromEnvTest, BadTfConfigIsNamed) {
  setenv("TESSERA_SECRET", kSecret, 1);
  setenv("TF_CONFIG", "{\"cluster\": ", 1);
  auto options = ClientOptions::FromEnv();
  ASSERT_FALSE(options.ok());
  EXPECT_NE(options.status().message().find("TF_CONFIG"), std::string::npos)
      << options.status().ToString();
}

TEST_F(FromEnvTest, SecretFromFileAndItsErrors) {
  setenv("TF_CONFIG", kTfConfig, 1);
  auto missing = ClientOptions::FromEnv();
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("TESSERA_SECRET"), std::string::npos);

  char path[] = "/tmp/tessera-secret-XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  close(fd);
  std::ofstream(path) << kSecret << "\n";
  setenv("TESSERA_SECRET_FILE", path, 1);
  auto options = ClientOptions::FromEnv();
  ASSERT_TRUE(options.ok()) << options.status().ToString();
  EXPECT_EQ(options->secret, kSecret);

  // A weak secret is refused unless allowed.
  std::ofstream(path) << "short\n";
  auto weak = ClientOptions::FromEnv();
  ASSERT_FALSE(weak.ok());
  EXPECT_NE(weak.status().message().find("TESSERA_ALLOW_WEAK_SECRET"), std::string::npos)
      << weak.status().ToString();
  setenv("TESSERA_ALLOW_WEAK_SECRET", "1", 1);
  auto allowed = ClientOptions::FromEnv();
  ASSERT_TRUE(allowed.ok()) << allowed.status().ToString();
  EXPECT_TRUE(allowed->allow_weak_secret);
  unlink(path);
}

TEST_F(FromEnvTest, BadTransportAndLogLevelAreNamed) {
  setenv("TF_CONFIG", kTfConfig, 1);
  setenv("TESSERA_SECRET", kSecret, 1);
  setenv("TESSERA_TRANSPORT", "carrier-pigeon", 1);
  auto transport = ClientOptions::FromEnv();
  ASSERT_FALSE(transport.ok());
  EXPECT_NE(transport.status().message().find("TESSERA_TRANSPORT='carrier-pigeon'"),
            std::string::npos);
  unsetenv("TESSERA_TRANSPORT");
  setenv("TESSERA_LOG_LEVEL", "chatty", 1);
  auto level = ClientOptions::FromEnv();
  ASSERT_FALSE(level.ok());
  EXPECT_NE(level.status().message().find("TESSERA_LOG_LEVEL"), std::string::npos);
  // A level's name in any case is that level (WARN was refused before).
  for (const char* spelled : {"WARN", "Warning", "ERROR", "Off"}) {
    setenv("TESSERA_LOG_LEVEL", spelled, 1);
    EXPECT_TRUE(ClientOptions::FromEnv().ok()) << spelled;
  }
  unsetenv("TESSERA_LOG_LEVEL");
}

}  // namespace
}  // namespace tessera
