// Runs the real trainshardd binary: exit codes for bad configs and key files (nothing written),
// a start, Status and artifact calls over gRPC on both listeners, and a clean SIGTERM shutdown.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <gtest/gtest.h>

#include "common/crypto/bech32.h"
#include "common/crypto/secp256k1.h"
#include "common/hex.h"
#include "gonka/trainshard/v1/host.grpc.pb.h"
#include "gonka/trainshard/v1/shard.grpc.pb.h"

namespace ts::sidecar {
namespace {

using ::testing::HasSubstr;
namespace pb = ::gonka::trainshard::v1;

const std::string kSecretHex(64, '1');

class TrainsharddTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir_template[] = "/tmp/ts-trainshardd-XXXXXX";
    ASSERT_NE(mkdtemp(dir_template), nullptr);
    dir_ = dir_template;
    key_file_ = dir_ + "/host.key";
    WriteFile(key_file_, kSecretHex + "\n", 0600);
    data_dir_ = dir_ + "/data";
  }
  void TearDown() override {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    std::system(("rm -rf " + dir_).c_str());
  }

  static void WriteFile(const std::string& path, const std::string& content, mode_t mode) {
    {
      std::ofstream out(path, std::ios::binary | std::ios::trunc);
      out << content;
    }
    chmod(path.c_str(), mode);
  }
  static std::string ReadFile(const std::string& path) {
    std::ifstream in(path);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }

  std::string Config(const std::string& extra = "") {
    std::string path = dir_ + "/trainshardd.toml";
    // Nothing listens on port 1: the chain is unreachable, which the daemon must survive.
    WriteFile(
        path,
        "chain_endpoint = \"127.0.0.1:1\"\n"
        "listen = \"127.0.0.1:0\"\n"
        "key_file = \"" +
            key_file_ + "\"\ndata_dir = \"" + data_dir_ +
            "\"\nshard_endpoint = \"127.0.0.1:7000\"\npoll_interval_ms = 50\n" +
            (extra.find("shard_listen") == std::string::npos ? "shard_listen = \"127.0.0.1:0\"\n"
                                                             : "") +
            extra,
        0644);
    return path;
  }

  void Start(const std::vector<std::string>& args) {
    log_ = dir_ + "/daemon.log";
    pid_ = fork();
    ASSERT_GE(pid_, 0);
    if (pid_ == 0) {
      int fd = open(log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(fd, 1);
      dup2(fd, 2);
      std::vector<char*> argv;
      std::string binary = TS_TRAINSHARDD;
      argv.push_back(binary.data());
      std::vector<std::string> copy = args;
      for (auto& a : copy) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(binary.c_str(), argv.data());
      _exit(127);
    }
  }
  // Waits for the daemon to exit; returns its exit code (-1 on timeout or signal).
  int Wait(int timeout_s = 20) {
    for (int i = 0; i < timeout_s * 100; ++i) {
      int status = 0;
      pid_t r = waitpid(pid_, &status, WNOHANG);
      if (r == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      }
      usleep(10000);
    }
    return -1;
  }
  int Run(const std::vector<std::string>& args) {
    Start(args);
    return Wait();
  }
  // Waits for the daemon to write <data_dir>/<name>; returns the address without the newline.
  std::string WaitAddr(const std::string& name) {
    std::string addr;
    for (int i = 0; i < 2000 && addr.empty(); ++i) {
      addr = ReadFile(data_dir_ + "/" + name);
      if (addr.empty()) usleep(10000);
    }
    if (addr.empty() || addr.back() != '\n') return "";
    addr.pop_back();
    return addr;
  }
  bool DataDirExists() {
    struct stat st {};
    return stat(data_dir_.c_str(), &st) == 0;
  }

  std::string dir_, key_file_, data_dir_, log_;
  pid_t pid_ = -1;
};

TEST_F(TrainsharddTest, BadConfigValueExitsTwoNamingItAndWritesNothing) {
  EXPECT_EQ(Run({"--config", Config("[policy]\nmax_shards = 99999\n")}), 2);
  EXPECT_THAT(ReadFile(log_), HasSubstr("policy.max_shards: 99999 is out of range"));
  EXPECT_FALSE(DataDirExists());

  EXPECT_EQ(Run({"--config", Config("[policy]\nmin_escrow_per_node = \"ten\"\n")}), 2);
  EXPECT_THAT(ReadFile(log_), HasSubstr("policy.min_escrow_per_node"));
  EXPECT_THAT(ReadFile(log_), HasSubstr("ten"));
  EXPECT_FALSE(DataDirExists());
}

TEST_F(TrainsharddTest, BadFlagOrMissingFileExitsTwo) {
  EXPECT_EQ(Run({"--config", Config(), "--listen", "nowhere"}), 2);
  EXPECT_THAT(ReadFile(log_), HasSubstr("listen: \\\"nowhere\\\""));
  EXPECT_EQ(Run({"--config", dir_ + "/missing.toml"}), 2);
  EXPECT_THAT(ReadFile(log_), HasSubstr("missing.toml"));
  EXPECT_EQ(Run({"--config", Config(), "--log-level", "chatty"}), 2);
  EXPECT_EQ(Run({"--no-such-flag"}), 2);
  EXPECT_FALSE(DataDirExists());
}

TEST_F(TrainsharddTest, KeyFileReadableByOthersIsRefused) {
  chmod(key_file_.c_str(), 0644);
  EXPECT_EQ(Run({"--config", Config()}), 2);
  std::string log = ReadFile(log_);
  EXPECT_THAT(log, HasSubstr(key_file_));
  EXPECT_THAT(log, HasSubstr("0644"));
  EXPECT_FALSE(DataDirExists());
}

TEST_F(TrainsharddTest, AFifoAsKeyFileOrConfigExitsTwoAtOnce) {
  // Opening a FIFO for reading waits for a writer; the daemon must refuse it instead (Wait
  // gives up after 20 s, which fails the test rather than hanging it).
  const std::string fifo = dir_ + "/key.fifo";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  std::string config = Config();
  std::string text = ReadFile(config);
  text.replace(text.find(key_file_), key_file_.size(), fifo);
  WriteFile(config, text, 0644);
  EXPECT_EQ(Run({"--config", config}), 2);
  EXPECT_THAT(ReadFile(log_), HasSubstr(fifo));
  EXPECT_THAT(ReadFile(log_), HasSubstr("not a regular file"));
  EXPECT_EQ(Run({"--config", fifo}), 2);
  EXPECT_THAT(ReadFile(log_), HasSubstr("not a regular file"));
  EXPECT_FALSE(DataDirExists());
}

TEST_F(TrainsharddTest, ServesStatusAndStopsOnSigterm) {
  Start({"--config", Config(), "--log-level", "debug"});
  std::string addr_file = data_dir_ + "/operator.addr";
  std::string addr;
  for (int i = 0; i < 2000 && addr.empty(); ++i) {
    addr = ReadFile(addr_file);
    if (addr.empty()) usleep(10000);
  }
  ASSERT_FALSE(addr.empty()) << ReadFile(log_);
  ASSERT_EQ(addr.back(), '\n');
  addr.pop_back();
  // The operator API is on the owner-only socket in the data dir; `listen` serves the query.
  EXPECT_EQ(addr, "unix:" + data_dir_ + "/host.sock");
  struct stat socket_stat {};
  ASSERT_EQ(lstat((data_dir_ + "/host.sock").c_str(), &socket_stat), 0);
  EXPECT_TRUE(S_ISSOCK(socket_stat.st_mode));
  EXPECT_EQ(socket_stat.st_mode & 0777, 0600u);
  struct stat dir_stat {};
  ASSERT_EQ(stat(data_dir_.c_str(), &dir_stat), 0);
  EXPECT_EQ(dir_stat.st_mode & 0777, 0700u);
  std::string query = WaitAddr("query.addr");
  ASSERT_THAT(query, ::testing::StartsWith("127.0.0.1:"));
  EXPECT_NE(query, "127.0.0.1:0");
  {
    auto public_stub =
        pb::HostOperator::NewStub(grpc::CreateChannel(query, grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    pb::HostStatusResponse status;
    EXPECT_EQ(public_stub->Status(&context, pb::HostStatusRequest(), &status).error_code(),
              grpc::StatusCode::UNIMPLEMENTED);
  }

  auto stub =
      pb::HostOperator::NewStub(grpc::CreateChannel(addr, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  pb::HostStatusResponse status;
  grpc::Status s = stub->Status(&context, pb::HostStatusRequest(), &status);
  ASSERT_TRUE(s.ok()) << s.error_message();
  auto key = common::PrivateKey::FromBytes(*common::HexDecode(kSecretHex));
  EXPECT_EQ(status.address(), common::AddressFromPublicKey(key->public_key()));
  EXPECT_EQ(status.cursor_height(), 0);

  // The artifact operator API is served next to HostOperator; with the chain unreachable the
  // host does not know its chain id, so stores cannot be opened yet.
  auto artifacts =
      pb::ArtifactOperator::NewStub(grpc::CreateChannel(addr, grpc::InsecureChannelCredentials()));
  {
    grpc::ClientContext list_context;
    list_context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    pb::ListLocalArtifactsRequest list;
    list.set_shard_id(1);
    pb::ListArtifactsResponse listed;
    grpc::Status refused = artifacts->List(&list_context, list, &listed);
    EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAVAILABLE) << refused.error_message();
    EXPECT_THAT(refused.error_message(), HasSubstr("chain id"));
  }
  {
    grpc::ClientContext bad_context;
    bad_context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    pb::VerifyArtifactsRequest verify;  // shard_id 0
    pb::VerifyArtifactsResponse verified;
    grpc::Status bad = artifacts->Verify(&bad_context, verify, &verified);
    EXPECT_EQ(bad.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(bad.error_message(), HasSubstr("shard_id: 0"));
  }

  // The peer-facing listener is bound (shard_listen port 0 here) and says why it cannot serve.
  std::string shard_addr = WaitAddr("shard.addr");
  ASSERT_THAT(shard_addr, ::testing::StartsWith("127.0.0.1:")) << ReadFile(log_);
  EXPECT_NE(shard_addr, "127.0.0.1:0");
  auto transfer = pb::ArtifactTransfer::NewStub(
      grpc::CreateChannel(shard_addr, grpc::InsecureChannelCredentials()));
  {
    grpc::ClientContext peer_context;
    peer_context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    pb::ListArtifactsRequest peer_list;
    peer_list.set_shard_id(1);
    pb::ListArtifactsResponse peer_listed;
    grpc::Status waiting = transfer->ListArtifacts(&peer_context, peer_list, &peer_listed);
    EXPECT_EQ(waiting.error_code(), grpc::StatusCode::UNAVAILABLE) << waiting.error_message();
  }

  kill(pid_, SIGTERM);
  EXPECT_EQ(Wait(), 0) << ReadFile(log_);
  EXPECT_THAT(ReadFile(log_), HasSubstr("shutting down"));
}

TEST_F(TrainsharddTest, ShardListenPortTakenExitsOneNamingIt) {
  Start({"--config", Config()});
  std::string shard_addr = WaitAddr("shard.addr");
  ASSERT_FALSE(shard_addr.empty()) << ReadFile(log_);
  pid_t first = pid_;
  std::string first_log = log_;

  // A second host on the same peer port must not start (and must not share the port).
  std::string second_dir = dir_ + "/second";
  std::string saved_data_dir = data_dir_;
  data_dir_ = second_dir;
  std::string config = Config("shard_listen = \"" + shard_addr + "\"\n");
  data_dir_ = saved_data_dir;
  log_ = dir_ + "/second.log";
  pid_ = fork();
  ASSERT_GE(pid_, 0);
  if (pid_ == 0) {
    int fd = open(log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    std::string binary = TS_TRAINSHARDD;
    std::string flag = "--config";
    char* argv[] = {binary.data(), flag.data(), config.data(), nullptr};
    execv(binary.c_str(), argv);
    _exit(127);
  }
  EXPECT_EQ(Wait(), 1) << ReadFile(log_);
  EXPECT_THAT(ReadFile(log_), HasSubstr("shard_listen: cannot bind " + shard_addr));

  pid_ = first;
  log_ = first_log;
  kill(pid_, SIGTERM);
  EXPECT_EQ(Wait(), 0) << ReadFile(log_);
}

TEST_F(TrainsharddTest, BadShardListenOrArtifactsDirExitsTwo) {
  EXPECT_EQ(Run({"--config", Config("shard_listen = \"nowhere\"\n")}), 2);
  EXPECT_THAT(ReadFile(log_), HasSubstr("shard_listen"));
  EXPECT_THAT(ReadFile(log_), HasSubstr("nowhere"));
  EXPECT_EQ(Run({"--config", Config("artifacts_dir = \"relative/dir\"\n")}), 2);
  EXPECT_THAT(ReadFile(log_), HasSubstr("artifacts_dir"));
  EXPECT_THAT(ReadFile(log_), HasSubstr("relative/dir"));
  EXPECT_FALSE(DataDirExists());
}

}  // namespace
}  // namespace ts::sidecar
