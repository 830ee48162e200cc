// Input whoever wrote it may have made anything. Files: a device, a FIFO,
// a link to /dev/zero, far more bytes than the file is for. Each is refused
// by name, unread, instead of filling memory until the OOM killer comes
// (TESSERA_SECRET_FILE=/dev/zero grew a process to 23.9 GB) or failing with
// std::bad_alloc and no fallback (a manifest linked to /dev/zero). Cluster
// specs: addresses that are not what they look like.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "ckpt/checkpoint.h"
#include "ckpt/safetensors.h"
#include "core/bounded_file.h"
#include "core/log.h"
#include "core/secret.h"
#include "tessera/cluster.h"
#include "wire/messages.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

class HostileFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/tessera-hostile-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string Write(const std::string& name, const std::string& text) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path) << text;
    return path;
  }
  std::string LinkToDevZero(const std::string& name) {
    const std::string path = dir_ + "/" + name;
    fs::create_symlink("/dev/zero", path);
    return path;
  }
  std::string dir_;
};

TEST_F(HostileFilesTest, OnlyRegularFilesWithinTheBoundAreRead) {
  EXPECT_EQ(ReadBoundedFile(Write("ok", "hello"), 5, "the file").value(), "hello");

  auto big = ReadBoundedFile(Write("big", "hello!"), 5, "the test file");
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(big.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(big.status().message().find("6 bytes, over the 5-byte limit"), std::string::npos)
      << big.status().ToString();

  auto zero = ReadBoundedFile(LinkToDevZero("zero"), 1 << 20, "the test file");
  ASSERT_FALSE(zero.ok());
  EXPECT_EQ(zero.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(zero.status().message().find("a character device"), std::string::npos)
      << zero.status().ToString();

  // Opening a FIFO for reading waits for a writer: it must not.
  const std::string fifo = dir_ + "/fifo";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  auto from_fifo = ReadBoundedFile(fifo, 1 << 20, "the test file");
  ASSERT_FALSE(from_fifo.ok());
  EXPECT_NE(from_fifo.status().message().find("a FIFO"), std::string::npos);

  auto from_dir = ReadBoundedFile(dir_, 1 << 20, "the test file");
  ASSERT_FALSE(from_dir.ok());
  EXPECT_NE(from_dir.status().message().find("a directory"), std::string::npos);

  auto missing = ReadBoundedFile(dir_ + "/nothing", 1 << 20, "the test file");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
}

TEST_F(HostileFilesTest, ASecretFileLinkedToDevZeroIsRefused) {
  const std::string zero = LinkToDevZero("secret");
  auto secret = LoadSecret(zero);
  ASSERT_FALSE(secret.ok());
  EXPECT_NE(secret.status().message().find("the cluster secret file"), std::string::npos)
      << secret.status().ToString();
  auto long_one = LoadSecret(Write("long", std::string(kMaxSecretFileBytes + 1, 'x')));
  EXPECT_EQ(long_one.status().code(), StatusCode::kResourceExhausted);
}

TEST_F(HostileFilesTest, AClusterSpecLinkedToDevZeroIsRefused) {
  auto spec = ClusterSpec::FromJsonFile(LinkToDevZero("cluster.json"));
  ASSERT_FALSE(spec.ok());
  EXPECT_NE(spec.status().message().find("the cluster spec file"), std::string::npos)
      << spec.status().ToString();
}

// Open() failing with a named DataLoss is what makes a restore fall back to
// the checkpoint before.
TEST_F(HostileFilesTest, ACheckpointWhoseFilesAreLinkedToDevZeroIsDamagedNotFatal) {
  const std::string step = dir_ + "/" + ckpt::StepDirName(5);
  fs::create_directory(step);
  fs::create_symlink("/dev/zero", step + "/" + ckpt::kManifestName);
  auto opened = ckpt::Checkpoint::Open(step, {.verify_data = false});
  ASSERT_FALSE(opened.ok());
  EXPECT_EQ(opened.status().code(), StatusCode::kDataLoss) << opened.status().ToString();
  EXPECT_NE(opened.status().message().find("a character device"), std::string::npos)
      << opened.status().ToString();

  auto whole = ckpt::SafetensorsFile::Read(LinkToDevZero("model.safetensors"));
  ASSERT_FALSE(whole.ok());
  EXPECT_NE(whole.status().message().find("not a regular file"), std::string::npos);
  const std::string fifo = dir_ + "/fifo.safetensors";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  auto header = ckpt::ReadSafetensorsHeader(fifo);  // must not wait for a writer
  ASSERT_FALSE(header.ok());
  EXPECT_NE(header.status().message().find("not a regular file"), std::string::npos);
}

// A NUL cut "10.0.0.1\0.evil" to "10.0.0.1" where it met C; a newline or an
// escape in a host name forged lines in the logs that print it.
TEST(HostileSpecTest, HostNamesWithControlCharactersAreRefused) {
  for (std::string host :
       {std::string("10.0.0.1\0.evil", 15), std::string("a\nb"), std::string("a\x1b[31mb")}) {
    auto addr = TaskAddress::Parse(host + ":2222");
    ASSERT_FALSE(addr.ok()) << "accepted a host with a control character";
    EXPECT_NE(addr.status().message().find("control character"), std::string::npos);
  }
  auto spec =
      ClusterSpec::FromJson(std::string("{\"ps\": [\"h\\u0000x:1\"], \"worker\": [\"w:2\"]}"));
  EXPECT_FALSE(spec.ok()) << "a JSON spec with \\u0000 in a host was accepted";
}

// Two ps tasks at one address: the second cannot listen, or answers for the
// first.
TEST(HostileSpecTest, AnAddressGivenTwiceIsRefused) {
  auto same_job = ClusterSpec::FromHostLists("h:1,h:1", "w:2", "");
  ASSERT_FALSE(same_job.ok());
  EXPECT_NE(same_job.status().message().find("h:1 is given twice in job 'ps'"), std::string::npos)
      << same_job.status().ToString();
  auto across = ClusterSpec::FromJson(R"({"ps": ["h:1"], "worker": ["h:1"]})");
  ASSERT_FALSE(across.ok());
  EXPECT_NE(across.status().message().find("is given to job"), std::string::npos)
      << across.status().ToString();
  EXPECT_TRUE(ClusterSpec::FromHostLists("h:1,h:2", "w:1", "").ok());
}

// A task name with a newline and an ANSI escape forged lines in a ps task's
// log: such names are refused where they are decoded, and whatever a peer
// sends that is logged as it came (an error message) has its control
// characters escaped.
TEST(HostileNamesTest, NamesWithControlCharactersAreRefusedAndLogsEscapeThem) {
  wire::Hello hello;
  hello.task = "/job:worker/task:0\n12:00:00.000 I [ps0] chief initialised \x1b[8m";
  auto frame = wire::Encode(hello, 1);
  auto header = wire::DecodeHeader(frame);
  ASSERT_TRUE(header.ok());
  auto decoded = wire::DecodeBody<wire::Hello>(*header, frame);
  ASSERT_FALSE(decoded.ok()) << "a hello whose task name holds a newline was decoded";
  EXPECT_NE(decoded.status().message().find("control character"), std::string::npos);

  wire::TensorDecl decl{"w\x1b[31m", DType::kF32, UpdateRule::kAdd, {4}, -1, {}, {}};
  decl.mode.total_num_replicas = 1;
  EXPECT_NE(wire::ValidateTensorDecl(decl).message().find("control character"), std::string::npos);

  ::testing::internal::CaptureStderr();
  TLOG_WARN("peer said: {}", std::string("line one\nforged\x1b[2J"));
  const std::string logged = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(logged.find("peer said: line one\\nforged\\x1b[2J"), std::string::npos) << logged;
  EXPECT_EQ(std::count(logged.begin(), logged.end(), '\n'), 1) << logged;
}

}  // namespace
}  // namespace tessera
