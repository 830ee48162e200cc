// Real processes: `tessera demo`, and `tessera launch --ps 2 --workers 3`
// running the integration worker, over tcp and over shared memory.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <unistd.h>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>

namespace {

struct Run {
  int exit_code;
  std::string output;
};

// Runs a shell command with a hard time limit; returns its exit code and output.
Run Shell(const std::string& cmd, int limit_s) {
  std::string full = "timeout -k 5 " + std::to_string(limit_s) + " " + cmd + " 2>&1";
  FILE* p = popen(full.c_str(), "r");
  std::string out;
  std::array<char, 4096> buf;
  while (size_t n = fread(buf.data(), 1, buf.size(), p)) out.append(buf.data(), n);
  int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

// Quotes a command for use inside a single-quoted sh -c argument.
std::string Escape(const std::string& s) {
  std::string out;
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out;
}

size_t Count(const std::string& haystack, const std::string& needle) {
  size_t n = 0;
  for (size_t pos = haystack.find(needle); pos != std::string::npos;
       pos = haystack.find(needle, pos + 1))
    ++n;
  return n;
}

// Waits (up to a minute) until no process's command line contains `text`.
// The lines of a clean run that would sound like an error (finding 22: every
// clean shutdown logged "Connection reset by remote peer" and "lost the
// coordinator ... rejoining"). Warnings about a busy host are not among
// them, nor a task at start saying whom it still waits for and why.
std::string ErrorSoundingLines(const std::string& output) {
  std::string found;
  std::istringstream lines(output);
  for (std::string line; std::getline(lines, line);) {
    if (line.find("] waiting for ") != std::string::npos ||
        line.find(" more for ps tasks (they may start in any order): ") != std::string::npos) {
      continue;
    }
    for (const char* sign : {" E [", "reset by", "lost the coordinator", "left the coordinator",
                             "disconnected:", "rejoining"}) {
      if (line.find(sign) != std::string::npos) {
        found += line + "\n";
        break;
      }
    }
  }
  return found;
}

bool WaitForNoProcess(const std::string& text) {
  // "[x]yz" matches "xyz" but not the pgrep's own command line.
  const std::string pattern = "[" + text.substr(0, 1) + "]" + text.substr(1);
  for (int i = 0; i < 600; ++i) {
    if (Shell("pgrep -f '" + pattern + "'", 10).exit_code == 1) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

class LaunchTest : public ::testing::TestWithParam<const char*> {};

TEST_P(LaunchTest, DemoPrintsIncrementsAndTen) {
  auto run = Shell(
      "env UCX_TLS=" + std::string(GetParam()) + " " + Env("TESSERA_BIN") + " demo --pause 0.05",
      120);
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_EQ(Count(run.output, "var += 1.0"), 10u) << run.output;
  EXPECT_NE(run.output.find("var = 10  (version 11"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("final value of var: 10.0"), std::string::npos) << run.output;
  EXPECT_EQ(ErrorSoundingLines(run.output), "") << "a clean run";
}

TEST_P(LaunchTest, TwoShardsThreeWorkersExactSums) {
  auto run = Shell("env UCX_TLS=" + std::string(GetParam()) + " " + Env("TESSERA_BIN") +
                       " launch --ps 2 --workers 3 -- " + Env("INTEGRATION_WORKER"),
                   300);
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_EQ(Count(run.output, "verified 200 tensors"), 3u) << run.output;
  EXPECT_EQ(ErrorSoundingLines(run.output), "") << "a clean run";
}

TEST_P(LaunchTest, FailingWorkerFailsTheLaunchAndStopsShards) {
  auto run = Shell("env UCX_TLS=" + std::string(GetParam()) + " " + Env("TESSERA_BIN") +
                       " launch --ps 1 --workers 2 -- sh -c 'exit 3'",
                   60);
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_NE(run.output.find("stopping the cluster"), std::string::npos) << run.output;
}

TEST(LaunchTest, SeparateCoordinatorTask) {
  auto run = Shell("env UCX_TLS=tcp " + Env("TESSERA_BIN") +
                       " launch --coordinator --ps 2 --workers 3 -- " + Env("INTEGRATION_WORKER"),
                   300);
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_EQ(Count(run.output, "verified 200 tensors"), 3u) << run.output;
  EXPECT_NE(run.output.find("[coordinator]"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("chief /job:worker/task:0 initialised"), std::string::npos);
  EXPECT_EQ(ErrorSoundingLines(run.output), "") << "a clean run";
}

// The coordinator's load, through the CLI: a launched sync run of 2 ps tasks
// x 3 workers x 100 steps, then `tessera status --json` on the running
// cluster (the chief runs it before it exits). The shards count steps: the
// coordinator heard at most one report per ps task per step, none from a
// worker, and its global step is 100.
TEST(LaunchTest, StatusShowsAtMostOneStepReportPerShardPerStep) {
  const std::string out = ::testing::TempDir() + "tessera-status-" + std::to_string(getpid());
  auto run = Shell("env UCX_TLS=tcp " + Env("TESSERA_BIN") + " launch --ps 2 --workers 3 -- " +
                       Env("INTEGRATION_WORKER") + " --sync-steps 100 --status-json " + out,
                   300);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_EQ(Count(run.output, "verified 8 sync tensors after 100 steps"), 3u) << run.output;
  std::ifstream in(out);
  const auto tasks = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  std::remove(out.c_str());
  ASSERT_TRUE(tasks.is_array()) << "no status JSON in " << out;
  int coordinators = 0;
  for (const auto& t : tasks) {
    ASSERT_FALSE(t.contains("error")) << t.dump();
    if (!t.value("coordinator", false)) continue;
    coordinators++;
    EXPECT_EQ(t.at("roles"), nlohmann::json({"shard", "coordinator"})) << "ps task 0 hosts it";
    EXPECT_EQ(t.at("global_step").get<uint64_t>(), 100u) << t.dump();
    const auto& reports = t.at("step_reports");
    ASSERT_EQ(reports.at("from_ps_tasks").size(), 2u) << t.dump();
    for (const auto& n : reports.at("from_ps_tasks")) {
      EXPECT_GE(n.get<uint64_t>(), 1u) << t.dump();
      EXPECT_LE(n.get<uint64_t>(), 100u) << t.dump();
    }
    EXPECT_EQ(reports.at("from_workers").get<uint64_t>(), 0u) << t.dump();
  }
  EXPECT_EQ(coordinators, 1) << tasks.dump();
}

// A coordinator task of its own builds no shard (docs/architecture.md):
// `tessera status --json` on a launched cluster with --coordinator shows it
// with the coordinator's role only, holding no parameters, and each ps task
// with a shard and no coordinator.
TEST(LaunchTest, ACoordinatorTaskOfItsOwnHoldsNoShard) {
  const std::string out = ::testing::TempDir() + "tessera-roles-" + std::to_string(getpid());
  auto run = Shell("env UCX_TLS=tcp " + Env("TESSERA_BIN") + " launch --coordinator --ps 2 " +
                       "--workers 2 -- " + Env("INTEGRATION_WORKER") + " --sync-steps 5 " +
                       "--status-json " + out,
                   300);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  std::ifstream in(out);
  const auto tasks = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  std::remove(out.c_str());
  ASSERT_TRUE(tasks.is_array()) << "no status JSON in " << out;
  int coordinators = 0, shards = 0;
  for (const auto& t : tasks) {
    ASSERT_FALSE(t.contains("error")) << t.dump();
    const auto roles = t.at("roles").get<std::vector<std::string>>();
    if (t.at("task").get<std::string>().starts_with("/job:coordinator/")) {
      coordinators++;
      EXPECT_EQ(roles, std::vector<std::string>{"coordinator"}) << t.dump();
      EXPECT_FALSE(t.contains("memory")) << "a coordinator of its own holds no parameters";
      EXPECT_EQ(t.at("stats").at("tensors").get<uint64_t>(), 0u) << t.dump();
      EXPECT_EQ(t.at("global_step").get<uint64_t>(), 5u) << t.dump();
    } else {
      shards++;
      EXPECT_EQ(roles, std::vector<std::string>{"shard"}) << t.dump();
      EXPECT_EQ(t.at("memory").get<std::string>(), "host memory") << t.dump();
      EXPECT_GT(t.at("stats").at("tensors").get<uint64_t>(), 0u) << t.dump();
    }
  }
  EXPECT_EQ(coordinators, 1) << tasks.dump();
  EXPECT_EQ(shards, 2) << tasks.dump();
}

// The example trains y = 2x + noise with synchronous SGD and converges.
TEST(LaunchTest, LinearRegressionExampleConverges) {
  auto run = Shell("env UCX_TLS=tcp " + Env("TESSERA_BIN") + " launch --ps 1 --workers 2 -- " +
                       Env("LINEAR_REGRESSION") + " 60",
                   120);
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("step  59"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("w 2.0"), std::string::npos) << run.output;
}

// The example reads its secret as every engine's job script gives it: from
// TESSERA_SECRET_FILE (docs/deploy.md), not only from TESSERA_SECRET.
TEST(LaunchTest, LinearRegressionTakesItsSecretFromAFile) {
  const std::string file = "/tmp/tessera-secret-" + std::to_string(getpid());
  const std::string worker = "sh -c 'umask 077; f=" + file +
                             ".$$; printf %s \"$TESSERA_SECRET\" > $f; "
                             "unset TESSERA_SECRET; TESSERA_SECRET_FILE=$f exec " +
                             Env("LINEAR_REGRESSION") + " 40'";
  auto run = Shell(
      "env UCX_TLS=tcp " + Env("TESSERA_BIN") + " launch --ps 1 --workers 2 -- " + worker, 120);
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("w 2.0"), std::string::npos) << run.output;
  Shell("rm -f " + file + ".*", 10);
}

// The example with checkpoints every half second: the whole cluster killed
// (SIGKILL to the launcher, whose children die with it) midway, then started
// again, resumes from the saved global step and still converges.
TEST(LaunchTest, LinearRegressionResumesAfterTheClusterIsKilled) {
  const std::string dir = "/tmp/tessera-linreg-" + std::to_string(getpid());
  Shell("rm -rf " + dir + " " + dir + "-config", 10);
  // Each launch makes its own cluster secret; the checkpoints' key is kept
  // across them (here under the test's own XDG_CONFIG_HOME).
  const std::string cmd = "env UCX_TLS=tcp XDG_CONFIG_HOME=" + dir + "-config " +
                          Env("TESSERA_BIN") + " launch --ps 1 --workers 2 --checkpoint-dir " +
                          dir + " --checkpoint-secs 0.5 -- " + Env("LINEAR_REGRESSION") + " 150 20";
  // Killed once a complete checkpoint past step 0 is on disk (its manifest
  // is written last), however slow the machine: midway through the 150
  // steps of at least 20 ms.
  auto first =
      Shell("sh -c '(" + Escape(cmd) + ") & pid=$!; i=0; " + "while [ $i -lt 1200 ] && ! ls " +
                dir + "/step-*/tessera.json 2>/dev/null | grep -qv step-00000000/; " +
                "do sleep 0.05; i=$((i+1)); done; kill -KILL $pid; wait $pid; echo rc=$?'",
            90);
  EXPECT_NE(first.output.find("rc=137"), std::string::npos) << first.output;
  EXPECT_EQ(first.output.find("step 140"), std::string::npos) << "finished before the kill";
  // The launcher's children die with it; the shards hold the directory.
  EXPECT_TRUE(WaitForNoProcess(dir));
  auto second = Shell(cmd, 120);
  EXPECT_EQ(second.exit_code, 0) << second.output;
  const auto at = second.output.find("resuming from the checkpoint of global step ");
  ASSERT_NE(at, std::string::npos) << second.output;
  const long step = std::atol(second.output.c_str() + at + 44);
  EXPECT_GT(step, 0) << second.output;
  EXPECT_LT(step, 150) << second.output;
  EXPECT_NE(second.output.find("restoring checkpoint"), std::string::npos) << second.output;
  EXPECT_NE(second.output.find("are authenticated with the key kept in " + dir +
                               "-config/tessera/checkpoint-keys/"),
            std::string::npos)
      << second.output;
  EXPECT_NE(second.output.find("w 2.0"), std::string::npos) << second.output;
  Shell("rm -rf " + dir + " " + dir + "-config", 10);
}

// --max-restarts: the ps task killed (SIGKILL) midway is started again on
// its address and restores its part from the checkpoint; the workers, whose
// calls to it failed, are restarted and resume; then a worker killed alone
// is restarted and rejoins its step. The job goes on and converges.
TEST(LaunchTest, MaxRestartsRestartsAKilledPsTaskAndAKilledWorker) {
  const std::string dir = "/tmp/tessera-restarts-" + std::to_string(getpid());
  const std::string log = dir + ".log";
  Shell("rm -rf " + dir + " " + log, 10);
  const std::string cmd = "env UCX_TLS=tcp " + Env("TESSERA_BIN") +
                          " launch --transport tcp --ps 1 --workers 2 --max-restarts 2 "
                          "--checkpoint-dir " +
                          dir + " --checkpoint-secs 0.5 -- " + Env("LINEAR_REGRESSION") + " 400 20";
  // Each kill waits for its condition (a checkpoint past step 0 on disk; a
  // worker resumed from it), however slow the machine.
  auto run = Shell(
      "sh -c '(" + Escape(cmd) + ") > " + log + " 2>&1 & pid=$!; i=0; " +
          "while [ $i -lt 1200 ] && ! ls " + dir +
          "/step-*/tessera.json 2>/dev/null | grep -qv step-00000000/; " +
          "do sleep 0.05; i=$((i+1)); done; pkill -KILL -f \"[s]erver.*" + dir + "\"; i=0; " +
          "while [ $i -lt 1200 ] && ! grep -q \"resuming from the checkpoint\" " + log +
          "; do sleep 0.05; i=$((i+1)); done; pkill -KILL -n -f \"[l]inear_regression 400\"; " +
          "wait $pid; echo rc=$?; cat " + log + "'",
      170);
  EXPECT_NE(run.output.find("rc=0"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("ps0 ended (killed by signal Killed); restarting it (1 of 2)"),
            std::string::npos)
      << run.output;
  // The ps task, and then the worker killed alone.
  EXPECT_EQ(Count(run.output, "ended (killed by signal Killed); restarting it"), 2u) << run.output;
  EXPECT_NE(run.output.find("step 399"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("w 2.0"), std::string::npos) << run.output;
  Shell("rm -rf " + dir + " " + log, 10);
}

// Ctrl-C (SIGINT) to the launcher stops every process it started, including
// what the workers started themselves.
TEST(LaunchTest, InterruptTearsEverythingDown) {
  // A sleep whose command line is unique to this test run.
  const std::string nap = "59." + std::to_string(getpid());
  std::string cmd = "env UCX_TLS=tcp " + Env("TESSERA_BIN") +
                    " launch --ps 2 --workers 2 -- sh -c 'sleep " + nap + "; echo woke'";
  auto run = Shell(
      "sh -c '(" + Escape(cmd) + ") & pid=$!; sleep 2; kill -INT $pid; wait $pid; echo rc=$?'", 60);
  EXPECT_NE(run.output.find("rc=130"), std::string::npos) << run.output;
  EXPECT_TRUE(WaitForNoProcess("sleep " + nap))
      << "left running: " << Shell("pgrep -af 'sleep " + nap + "'", 10).output;
  Shell("pkill -f '[s]leep " + nap + "'", 10);
}

INSTANTIATE_TEST_SUITE_P(Ucx, LaunchTest, ::testing::Values("tcp", "posix,sysv,cma,tcp"),
                         [](const auto& test_info) {
                           return std::string(test_info.param) == "tcp" ? "tcp" : "shm";
                         });

// Shards and workers in separate network namespaces joined by veth pairs,
// as separate hosts would be.
TEST(NetnsTest, ClusterAcrossNamespaces) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to create network namespaces";
  if (Shell("ip netns list", 10).exit_code != 0) GTEST_SKIP() << "`ip netns` is not available";
  auto run = Shell(
      "bash " + Env("NETNS_SCRIPT") + " " + Env("TESSERA_BIN") + " " + Env("INTEGRATION_WORKER"),
      300);
  if (run.exit_code == 77) GTEST_SKIP() << run.output;
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_EQ(Count(run.output, "verified 200 tensors"), 3u) << run.output;
}

// A shard busy with long bulk transfers over a slow link (16 Mbit/s, 8 s per
// transfer against the default 5 s heartbeat timeout) is not declared dead:
// its transfers' completions count as signs of life.
TEST(NetnsTest, SlowLinkBulkTransferIsNotADeadShard) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to create network namespaces";
  if (Shell("ip netns list", 10).exit_code != 0) GTEST_SKIP() << "`ip netns` is not available";
  auto run = Shell("bash " + Env("NETNS_THROTTLED_SCRIPT") + " " + Env("TESSERA_BIN") + " " +
                       Env("INTEGRATION_WORKER"),
                   240);
  if (run.exit_code == 77) GTEST_SKIP() << run.output;
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_EQ(run.output.find("no answer to heartbeats"), std::string::npos) << run.output;
  EXPECT_EQ(Count(run.output, "verified 1 tensors"), 1u) << run.output;
}

}  // namespace
