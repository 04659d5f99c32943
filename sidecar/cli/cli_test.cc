// Unit tests of the trainshard CLI run in-process: flag errors (exit 2 naming the flag), key
// files, ADDR=AMOUNT parsing, JSON shapes, and the host and artifact commands against real gRPC
// servers on 127.0.0.1 that play a host sidecar.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <memory>
#include <sstream>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "common/crypto/bech32.h"
#include "common/hex.h"
#include "common/key_file.h"
#include "common/status.h"
#include "cosmos/tx/v1beta1/tx.pb.h"
#include "gmock/gmock.h"
#include "gonka/trainshard/v1/host.grpc.pb.h"
#include "gonka/trainshard/v1/shard.grpc.pb.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "sidecar/cli/cli.h"
#include "sidecar/cli/context.h"
#include "sidecar/cli/output.h"
#include "sidecar/cli/parse.h"

namespace ts::sidecar {
namespace {

namespace pb = ::gonka::trainshard::v1;
using ::testing::HasSubstr;
using ::testing::Not;

struct CliResult {
  int code = -1;
  std::string out;
  std::string err;
};

CliResult Cli(const std::vector<std::string>& args) {
  std::ostringstream out;
  std::ostringstream err;
  CliResult result;
  result.code = RunCli(args, out, err);
  result.out = out.str();
  result.err = err.str();
  return result;
}

std::string Describe(const CliResult& r) {
  return "exit " + std::to_string(r.code) + "\nstdout: " + r.out + "\nstderr: " + r.err;
}

class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "ts-cli-XXXXXX").string();
    TS_CHECK(::mkdtemp(pattern.data()) != nullptr);
    path_ = pattern;
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::string File(const std::string& name) const { return path_ + "/" + name; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

std::string AddressOf(const common::PrivateKey& key) {
  return common::AddressFromPublicKey(key.public_key());
}

std::string FreshAddress() { return AddressOf(common::PrivateKey::Generate()); }

void WriteFile(const std::string& path, const std::string& content, mode_t mode) {
  std::ofstream(path) << content;
  ::chmod(path.c_str(), mode);
}

mode_t ModeOf(const std::string& path) {
  struct stat st;
  TS_CHECK(::stat(path.c_str(), &st) == 0);
  return st.st_mode & 07777;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// ---------------------------------------------------------------------------------------------
// Usage errors: exit 2 and the flag named.

struct UsageCase {
  std::vector<std::string> args;
  std::vector<std::string> mentions;  // what stderr must name
};

class UsageErrorTest : public ::testing::TestWithParam<UsageCase> {};

TEST_P(UsageErrorTest, ExitsTwoNamingTheFlag) {
  const UsageCase& c = GetParam();
  CliResult r = Cli(c.args);
  EXPECT_EQ(r.code, kExitUsage) << Describe(r);
  EXPECT_EQ(r.out, "") << "nothing on stdout for a usage error";
  for (const auto& mention : c.mentions) EXPECT_THAT(r.err, HasSubstr(mention)) << Describe(r);
}

const std::string kGoodAddress = common::AddressFromBytes(std::string(20, '\0'));

INSTANTIATE_TEST_SUITE_P(
    Flags, UsageErrorTest,
    ::testing::Values(
        UsageCase{{}, {"subcommand"}}, UsageCase{{"frobnicate"}, {"frobnicate"}},
        UsageCase{{"bank", "balance"}, {"--address"}},
        UsageCase{{"bank", "balance", "--address", "gonka1notanaddress"},
                  {"--address", "gonka1notanaddress"}},
        UsageCase{{"bank", "send", "--to", "cosmos1xyz", "--amount", "5"}, {"--to", "cosmos1xyz"}},
        UsageCase{{"proposal", "show", "--id", "abc"}, {"--id", "abc"}},
        UsageCase{{"proposal", "show", "--id", "-3"}, {"--id"}},
        UsageCase{{"shard", "list", "--status", "sleeping"}, {"--status", "sleeping"}},
        UsageCase{{"chain", "status", "--timeout-ms", "0"}, {"--timeout-ms"}},
        UsageCase{{"chain", "events"}, {"--from"}},
        UsageCase{{"chain", "events", "--from", "0"}, {"--from"}},
        UsageCase{{"chain", "events", "--from", "9", "--to", "3"}, {"--to", "3"}},
        UsageCase{{"chain", "events", "--from", "1", "--to", "200001"}, {"--from", "--to"}},
        UsageCase{{"keys", "new"}, {"--out"}}, UsageCase{{"keys", "show"}, {"--key"}},
        UsageCase{{"host", "status", "--host", "localhost"}, {"--host", "localhost"}},
        UsageCase{{"host", "status", "--host", "127.0.0.1:99999"}, {"--host", "99999"}},
        UsageCase{{"host", "events", "--host", "127.0.0.1:1", "--from", "-1"}, {"--from"}},
        UsageCase{{"shard", "reserve", "--id", "1", "--host", "a:b"}, {"--host", "a:b"}},
        UsageCase{{"devnet", "init", "--home", "/nonexistent-ts/x"}, {"--chain-id"}},
        UsageCase{{"devnet", "init", "--home", "h", "--genesis", "g.json", "--chain-id", "c"},
                  {"--genesis", "--chain-id"}},
        UsageCase{{"devnet", "init", "--home", "h", "--chain-id", "c", "--account", "nope=5"},
                  {"--account", "nope=5"}},
        UsageCase{{"devnet", "start", "--home", "h", "--listen", "nowhere"},
                  {"--listen", "nowhere"}},
        UsageCase{{"proposal", "vote", "--id", "1", "--option", "maybe"}, {"--option", "maybe"}},
        UsageCase{{"proposal", "submit", "--spec", "/nonexistent-ts/spec.json", "--deposit", "5"},
                  {"--spec", "/nonexistent-ts/spec.json"}},
        // One past 2^64-1 is refused, not clamped to 2^64-1.
        UsageCase{{"shard", "status", "--id", "18446744073709551616"},
                  {"--id", "18446744073709551616", "larger than 18446744073709551615"}},
        UsageCase{{"proposal", "vote", "--id", "99999999999999999999", "--option", "yes"},
                  {"--id", "99999999999999999999"}},
        UsageCase{{"chain", "events", "--from", "1", "--to", "18446744073709551616"},
                  {"--to", "18446744073709551616"}}),
    // Stable names (the index), so test discovery and runs agree whatever the addresses.
    [](const ::testing::TestParamInfo<UsageCase>& info) {
      return "case" + std::to_string(info.index);
    });

const std::string kHex64(64, 'a');

INSTANTIATE_TEST_SUITE_P(
    ArtifactFlags, UsageErrorTest,
    ::testing::Values(
        UsageCase{{"artifact"}, {"subcommand"}},
        UsageCase{{"artifact", "publish", "--host", "127.0.0.1:1", "--shard", "1"}, {"--dir"}},
        UsageCase{{"artifact", "publish", "--host", "127.0.0.1:1", "--dir", "/tmp"}, {"--shard"}},
        UsageCase{{"artifact", "publish", "--shard", "1", "--dir", "/tmp"}, {"--host"}},
        UsageCase{{"artifact", "publish", "--host", "localhost", "--shard", "1", "--dir", "/tmp"},
                  {"--host", "localhost"}},
        UsageCase{{"artifact", "publish", "--host", "127.0.0.1:1", "--shard", "0", "--dir", "/tmp"},
                  {"--shard 0"}},
        UsageCase{
            {"artifact", "publish", "--host", "127.0.0.1:1", "--shard", "-2", "--dir", "/tmp"},
            {"--shard"}},
        UsageCase{{"artifact", "publish", "--host", "127.0.0.1:1", "--shard", "1", "--dir",
                   "/nonexistent-ts/ckpt"},
                  {"--dir", "/nonexistent-ts/ckpt"}},
        UsageCase{{"artifact", "publish", "--host", "127.0.0.1:1", "--shard", "1", "--dir",
                   "/etc/passwd"},
                  {"--dir", "not a directory"}},
        UsageCase{{"artifact", "publish", "--host", "127.0.0.1:1", "--shard", "1", "--dir", "/tmp",
                   "--parent", "abcd"},
                  {"--parent", "abcd"}},
        UsageCase{{"artifact", "publish", "--host", "127.0.0.1:1", "--shard", "1", "--dir", "/tmp",
                   "--kind", "Check Point"},
                  {"--kind", "Check Point"}},
        UsageCase{{"artifact", "publish", "--host", "127.0.0.1:1", "--shard", "1", "--dir", "/tmp",
                   "--chunk-size", "100"},
                  {"--chunk-size", "100"}},
        UsageCase{{"artifact", "publish", "--host", "127.0.0.1:1", "--shard", "1", "--dir", "/tmp",
                   "--round", "x"},
                  {"--round", "x"}},
        UsageCase{{"artifact", "fetch", "--host", "127.0.0.1:1", "--shard", "1"}, {"--id"}},
        UsageCase{{"artifact", "fetch", "--host", "127.0.0.1:1", "--shard", "1", "--id", "xyz"},
                  {"--id", "xyz"}},
        UsageCase{{"artifact", "fetch", "--host", "127.0.0.1:1", "--shard", "1", "--id", kHex64,
                   "--peer", "cosmos1abc"},
                  {"--peer", "cosmos1abc"}},
        UsageCase{{"artifact", "fetch", "--host", "127.0.0.1:1", "--shard", "1", "--id", kHex64,
                   "--peer", kGoodAddress, "--peer", kGoodAddress},
                  {"--peer", "twice"}},
        UsageCase{{"artifact", "list", "--host", "127.0.0.1:1"}, {"--shard"}},
        UsageCase{{"artifact", "verify", "--shard", "1"}, {"--host"}},
        UsageCase{{"artifact", "gc", "--host", "127.0.0.1:1", "--shard", "1", "--drop", "12"},
                  {"--drop", "12"}}),
    [](const ::testing::TestParamInfo<UsageCase>& info) {
      return "artifact_case" + std::to_string(info.index);
    });

TEST(UsageTest, LeadingZerosAreDecimalNotOctal) {
  // CLI11 alone reads "010" as octal 8; the flag means ten. --to below --from names the value
  // read, so the refusal shows which.
  CliResult r = Cli({"chain", "events", "--from", "11", "--to", "010"});
  EXPECT_EQ(r.code, kExitUsage) << Describe(r);
  EXPECT_THAT(r.err, HasSubstr("--to 10: below --from 11")) << Describe(r);
}

TEST(UsageTest, AFifoAsSpecOrKeyIsRefusedAtOnce) {
  TempDir dir;
  const std::string fifo = dir.File("spec.fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"proposal", "submit", "--spec", fifo, "--deposit", "5"},
        std::vector<std::string>{"keys", "show", "--key", fifo}}) {
    // Run on a thread of its own: an open() that waits for a writer fails the test instead of
    // hanging it (a writer is then opened so the thread can end).
    auto promise = std::make_shared<std::promise<CliResult>>();
    auto future = promise->get_future();
    std::thread run([promise, args] { promise->set_value(Cli(args)); });
    if (future.wait_for(std::chrono::seconds(5)) != std::future_status::ready) {
      ADD_FAILURE() << args[0] << " " << args[1] << " blocked on a FIFO";
      int unblock = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
      if (unblock >= 0) ::close(unblock);
    }
    run.join();
    CliResult r = future.get();
    EXPECT_EQ(r.code, kExitUsage) << Describe(r);
    EXPECT_THAT(r.err, HasSubstr(fifo)) << Describe(r);
    EXPECT_THAT(r.err, HasSubstr("not a regular file")) << Describe(r);
  }
}

// The run spec a proposal carries on chain is checked before any key is loaded or deposit
// locked: a document the hosts would refuse, or one the chain would not carry, is named here.
TEST(UsageTest, AProposalsRunSpecIsCheckedBeforeSubmitting) {
  TempDir dir;
  WriteFile(dir.File("spec.json"), R"({"hardware_profile": "cpu-small"})", 0600);
  WriteFile(dir.File("bad.json"), R"({"version": 1, "model": {"kind": "mamba"}})", 0600);
  WriteFile(dir.File("huge.json"), std::string(65537, ' '), 0600);
  for (const auto& [file, mention] : std::vector<std::pair<std::string, std::string>>{
           {"bad.json", "model.kind"}, {"huge.json", "65537 bytes"}}) {
    CliResult r = Cli({"proposal", "submit", "--spec", dir.File("spec.json"), "--run-spec",
                       dir.File(file), "--deposit", "5"});
    EXPECT_EQ(r.code, kExitUsage) << Describe(r);
    EXPECT_THAT(r.err, HasSubstr("--run-spec \"" + dir.File(file) + "\"")) << Describe(r);
    EXPECT_THAT(r.err, HasSubstr(mention)) << Describe(r);
  }
}

TEST(UsageTest, SignedCommandsNeedAKey) {
  CliResult r = Cli({"bank", "send", "--to", kGoodAddress, "--amount", "5"});
  EXPECT_EQ(r.code, kExitUsage) << Describe(r);
  EXPECT_THAT(r.err, HasSubstr("--key"));
  EXPECT_THAT(r.err, HasSubstr("bank send"));
}

TEST(UsageTest, BadAmountNamesFlagAndValue) {
  for (const std::string amount : {"01", "-5", "1e3", "18446744073709551616", ""}) {
    CliResult r = Cli({"bank", "send", "--to", kGoodAddress, "--amount", amount});
    EXPECT_EQ(r.code, kExitUsage) << amount << " " << Describe(r);
    EXPECT_THAT(r.err, HasSubstr("--amount")) << amount;
  }
}

TEST(UsageTest, SettleChecksEveryFlagBeforeCallingAnyone) {
  std::vector<std::string> base = {"shard", "settle", "--id", "1", "--chain", "127.0.0.1:1"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = base;
    args.insert(args.end(), extra.begin(), extra.end());
    return Cli(args);
  };
  std::string root(64, 'a');
  CliResult r = with({"--hosts", "127.0.0.1:5", "--final-root", "abcd"});
  EXPECT_EQ(r.code, kExitUsage) << Describe(r);
  EXPECT_THAT(r.err, HasSubstr("--final-root"));
  r = with({"--hosts", "127.0.0.1:5", "--final-root", std::string(64, 'z')});
  EXPECT_EQ(r.code, kExitUsage) << Describe(r);
  EXPECT_THAT(r.err, HasSubstr("not hexadecimal"));
  r = with({"--hosts", "127.0.0.1:5,,127.0.0.1:6", "--final-root", root});
  EXPECT_EQ(r.code, kExitUsage) << Describe(r);
  EXPECT_THAT(r.err, HasSubstr("--hosts"));
  r = with({"--hosts", "127.0.0.1:5,127.0.0.1:5", "--final-root", root});
  EXPECT_EQ(r.code, kExitUsage) << Describe(r);
  EXPECT_THAT(r.err, HasSubstr("twice"));
  r = with({"--hosts", "127.0.0.1:5", "--final-root", root, "--payout", kGoodAddress + "=x"});
  EXPECT_EQ(r.code, kExitUsage) << Describe(r);
  EXPECT_THAT(r.err, HasSubstr("--payout"));
  r = with({"--hosts", "127.0.0.1:5", "--final-root", root, "--eval-value-micro", "5"});
  EXPECT_EQ(r.code, kExitUsage) << Describe(r);
  EXPECT_THAT(r.err, HasSubstr("--eval-metric"));
  r = with({"--hosts", "127.0.0.1:5", "--final-root", root, "--eval-metric", "eval_loss"});
  EXPECT_EQ(r.code, kExitUsage) << Describe(r);
  EXPECT_THAT(r.err, HasSubstr("--eval-value-micro"));
  r = with({"--hosts", "127.0.0.1:5", "--final-root", root, "--submit-via", "x"});
  EXPECT_EQ(r.code, kExitUsage) << Describe(r);
  EXPECT_THAT(r.err, HasSubstr("--submit-via"));
  // All flags fine, no --submit-via: the key is required before anyone is asked.
  r = with({"--hosts", "127.0.0.1:5", "--final-root", root});
  EXPECT_EQ(r.code, kExitUsage) << Describe(r);
  EXPECT_THAT(r.err, HasSubstr("--key"));
}

TEST(UsageTest, HelpExitsZero) {
  CliResult r = Cli({"--help"});
  EXPECT_EQ(r.code, 0) << Describe(r);
  EXPECT_THAT(r.out, HasSubstr("proposal"));
  r = Cli({"shard", "settle", "--help"});
  EXPECT_EQ(r.code, 0) << Describe(r);
  EXPECT_THAT(r.out, HasSubstr("--final-root"));
}

TEST(UsageTest, GlobalOptionsGoBeforeOrAfterTheCommand) {
  // Port 1 on loopback refuses connections: both spellings reach the (unreachable) chain.
  CliResult before = Cli({"--chain", "127.0.0.1:1", "--timeout-ms", "2000", "chain", "status"});
  CliResult after = Cli({"chain", "status", "--chain", "127.0.0.1:1", "--timeout-ms", "2000"});
  EXPECT_EQ(before.code, kExitUnreachable) << Describe(before);
  EXPECT_EQ(after.code, kExitUnreachable) << Describe(after);
  EXPECT_THAT(after.err, HasSubstr("127.0.0.1:1"));
}

TEST(UsageTest, ChainFromEnvironment) {
  ::setenv("TRAINSHARD_CHAIN", "127.0.0.1:2", 1);
  CliResult r = Cli({"chain", "params", "--timeout-ms", "2000"});
  ::unsetenv("TRAINSHARD_CHAIN");
  EXPECT_EQ(r.code, kExitUnreachable) << Describe(r);
  EXPECT_THAT(r.err, HasSubstr("127.0.0.1:2"));
}

// ---------------------------------------------------------------------------------------------
// Key files.

TEST(KeysTest, NewWritesMode0600HexAndRefusesToOverwrite) {
  TempDir dir;
  std::string path = dir.File("a.key");
  CliResult r = Cli({"keys", "new", "--out", path, "--json"});
  ASSERT_EQ(r.code, 0) << Describe(r);
  auto doc = nlohmann::json::parse(r.out);
  ASSERT_TRUE(doc.is_object());
  EXPECT_EQ(doc.size(), 2u);
  std::string address = doc.at("address");
  std::string public_key = doc.at("public_key");
  EXPECT_EQ(ModeOf(path), 0600u);
  std::string content = ReadAll(path);
  ASSERT_EQ(content.size(), 65u);
  EXPECT_EQ(content.back(), '\n');
  auto secret = common::HexDecode(content.substr(0, 64));
  ASSERT_TRUE(secret.ok());
  auto key = common::PrivateKey::FromBytes(*secret);
  ASSERT_TRUE(key.ok());
  EXPECT_EQ(AddressOf(*key), address);
  EXPECT_EQ(common::HexEncode(key->public_key()), public_key);
  // No temporary file is left next to it.
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.path()),
                          std::filesystem::directory_iterator()),
            1);

  CliResult again = Cli({"keys", "new", "--out", path});
  EXPECT_EQ(again.code, kExitUsage) << Describe(again);
  EXPECT_THAT(again.err, HasSubstr("already exists"));
  EXPECT_EQ(ReadAll(path), content) << "an existing key file must never be overwritten";

  CliResult show = Cli({"keys", "show", "--key", path, "--json"});
  ASSERT_EQ(show.code, 0) << Describe(show);
  EXPECT_EQ(nlohmann::json::parse(show.out), doc);
  CliResult human = Cli({"keys", "show", "--key", path});
  ASSERT_EQ(human.code, 0) << Describe(human);
  EXPECT_THAT(human.out, HasSubstr("address:"));
  EXPECT_THAT(human.out, HasSubstr(address));
}

TEST(KeysTest, NewInAMissingDirectoryFails) {
  TempDir dir;
  CliResult r = Cli({"keys", "new", "--out", dir.File("no/such/dir/k.key")});
  EXPECT_EQ(r.code, kExitUsage) << Describe(r);
  EXPECT_THAT(r.err, HasSubstr("--out"));
}

TEST(KeysTest, ShowRefusesGroupOrOtherReadableFilesNamingTheMode) {
  TempDir dir;
  std::string path = dir.File("k.key");
  ASSERT_EQ(Cli({"keys", "new", "--out", path}).code, 0);
  for (mode_t mode : {0644, 0640, 0604, 0610}) {
    ::chmod(path.c_str(), mode);
    CliResult r = Cli({"keys", "show", "--key", path});
    EXPECT_EQ(r.code, kExitUsage) << Describe(r);
    char octal[8];
    std::snprintf(octal, sizeof(octal), "%04o", mode);
    EXPECT_THAT(r.err, HasSubstr(octal)) << Describe(r);
    EXPECT_THAT(r.err, HasSubstr(path));
  }
  ::chmod(path.c_str(), 0400);
  EXPECT_EQ(Cli({"keys", "show", "--key", path}).code, 0);
}

TEST(KeysTest, BadKeyFilesAreRefusedWithoutEchoingTheirContent) {
  TempDir dir;
  std::string secretish = std::string(63, 'a') + "g";
  WriteFile(dir.File("bad_hex.key"), secretish + "\n", 0600);
  WriteFile(dir.File("short.key"), "abcd\n", 0600);
  WriteFile(dir.File("zero.key"), std::string(64, '0') + "\n", 0600);
  for (const char* name : {"bad_hex.key", "short.key", "zero.key", "missing.key"}) {
    CliResult r = Cli({"keys", "show", "--key", dir.File(name)});
    EXPECT_EQ(r.code, kExitUsage) << name << " " << Describe(r);
    EXPECT_THAT(r.err, HasSubstr("--key")) << name;
    EXPECT_THAT(r.err, Not(HasSubstr(secretish))) << name;
    EXPECT_THAT(r.err, Not(HasSubstr(std::string(64, '0')))) << name;
  }
  std::filesystem::create_directory(dir.File("dir.key"));
  ::chmod(dir.File("dir.key").c_str(), 0700);
  EXPECT_EQ(Cli({"keys", "show", "--key", dir.File("dir.key")}).code, kExitUsage);
}

TEST(KeyFileTest, RoundTripAndCodes) {
  TempDir dir;
  common::PrivateKey key = common::PrivateKey::Generate();
  ASSERT_TRUE(common::WriteNewKeyFile(dir.File("k"), key).ok());
  auto read = common::ReadKeyFile(dir.File("k"));
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->secret(), key.secret());
  EXPECT_TRUE(absl::IsAlreadyExists(common::WriteNewKeyFile(dir.File("k"), key)));
  EXPECT_TRUE(absl::IsNotFound(common::ReadKeyFile(dir.File("nope")).status()));
  ::chmod(dir.File("k").c_str(), 0660);
  EXPECT_TRUE(absl::IsPermissionDenied(common::ReadKeyFile(dir.File("k")).status()));
  // Surrounding whitespace is tolerated (editors add it).
  WriteFile(dir.File("ws"), "  " + common::HexEncode(key.secret()) + " \r\n\n", 0600);
  auto spaced = common::ReadKeyFile(dir.File("ws"));
  ASSERT_TRUE(spaced.ok()) << spaced.status();
  EXPECT_EQ(spaced->public_key(), key.public_key());
  WriteFile(dir.File("big"), std::string(5000, 'a'), 0600);
  EXPECT_TRUE(absl::IsFailedPrecondition(common::ReadKeyFile(dir.File("big")).status()));
}

TEST(KeyFileTest, WriteThroughADanglingSymlinkIsRefused) {
  TempDir dir;
  std::filesystem::create_symlink(dir.File("target"), dir.File("link"));
  EXPECT_TRUE(absl::IsAlreadyExists(
      common::WriteNewKeyFile(dir.File("link"), common::PrivateKey::Generate())));
  EXPECT_FALSE(std::filesystem::exists(dir.File("target")));
}

// ---------------------------------------------------------------------------------------------
// ADDR=AMOUNT and other values.

TEST(ParseTest, AddressAmount) {
  std::string a = FreshAddress();
  auto ok = ParseAddressAmount("--account", a + "=1000");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->address, a);
  EXPECT_EQ(ok->value, 1000u);
  auto max = ParseAddressAmount("--account", a + "=18446744073709551615");
  ASSERT_TRUE(max.ok());
  EXPECT_EQ(max->value, UINT64_MAX);

  struct Bad {
    std::string text;
    std::string why;
  };
  for (const Bad& bad : std::vector<Bad>{
           {a, "expected ADDR=AMOUNT"},
           {a + "=", "expected ADDR=AMOUNT"},
           {"=5", "expected ADDR=AMOUNT"},
           {a + "=01", "leading zero"},
           {a + "=-1", "amount"},
           {a + "=1.5", "amount"},
           {a + "=18446744073709551616", "overflows"},
           {"gonka1xyz=5", "address"},
           {a.substr(0, a.size() - 1) + (a.back() == 'q' ? "p" : "q") + "=5", "address"},
       }) {
    auto r = ParseAddressAmount("--account", bad.text);
    ASSERT_FALSE(r.ok()) << bad.text;
    EXPECT_TRUE(absl::IsInvalidArgument(r.status()));
    std::string message(r.status().message());
    EXPECT_THAT(message, HasSubstr("--account")) << bad.text;
    EXPECT_THAT(message, HasSubstr("\"" + bad.text + "\"")) << bad.text;
    EXPECT_THAT(message, HasSubstr(bad.why)) << bad.text;
  }
}

TEST(ParseTest, RepeatedPairsRefuseDuplicates) {
  std::string a = FreshAddress();
  std::string b = FreshAddress();
  auto ok = ParseAddressWeights("--weight", {a + "=1", b + "=2"});
  ASSERT_TRUE(ok.ok());
  ASSERT_EQ(ok->size(), 2u);
  EXPECT_EQ((*ok)[1].address, b);
  EXPECT_EQ((*ok)[1].value, 2u);
  auto dup = ParseAddressWeights("--weight", {a + "=1", a + "=2"});
  ASSERT_FALSE(dup.ok());
  EXPECT_THAT(std::string(dup.status().message()), HasSubstr("twice"));
  EXPECT_THAT(std::string(dup.status().message()), HasSubstr("--weight"));
  auto bad = ParseAddressWeights("--weight", {a + "=1", b});
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("ADDR=WEIGHT"));
}

TEST(ParseTest, EndpointsHexAndEnums) {
  EXPECT_TRUE(ParseEndpoint("--host", "127.0.0.1:9000").ok());
  EXPECT_TRUE(ParseEndpoint("--host", "[::1]:9000").ok());
  EXPECT_TRUE(ParseEndpoint("--host", "node-1.example:1").ok());
  for (const char* bad : {"127.0.0.1", ":9000", "127.0.0.1:", "127.0.0.1:0", "127.0.0.1:65536",
                          "::1:9000", "a b:1", "127.0.0.1:9x"}) {
    EXPECT_FALSE(ParseEndpoint("--host", bad).ok()) << bad;
  }
  EXPECT_TRUE(ParseListenAddress("--listen", "127.0.0.1:0").ok());
  auto list = ParseEndpointList("--hosts", "127.0.0.1:1,127.0.0.1:2");
  ASSERT_TRUE(list.ok());
  EXPECT_EQ(list->size(), 2u);
  EXPECT_FALSE(ParseEndpointList("--hosts", "").ok());

  auto root = ParseHex32("--final-root", std::string(64, 'A'));
  ASSERT_TRUE(root.ok());
  EXPECT_EQ(*root, std::string(32, '\xaa'));
  EXPECT_FALSE(ParseHex32("--final-root", std::string(62, 'a')).ok());

  EXPECT_EQ(ParseShardStatus("--status", "running").value(), pb::SHARD_STATUS_RUNNING);
  EXPECT_FALSE(ParseShardStatus("--status", "RUNNING").ok());
  EXPECT_EQ(ParseVoteOption("--option", "veto").value(), cosmos::gov::v1::VOTE_OPTION_NO_WITH_VETO);
}

TEST(ParseTest, HostTargetsAreTheOperatorSocketByDataDirPathOrUnixUri) {
  TempDir dir;
  // A data dir: its operator.addr names the socket.
  WriteFile(dir.File("operator.addr"), "unix:/srv/h1/data/host.sock\n", 0600);
  EXPECT_EQ(ParseHostTarget("--host", dir.path()).value(), "unix:/srv/h1/data/host.sock");
  EXPECT_EQ(ParseHostTarget("--host", "unix:/run/ts/host.sock").value(), "unix:/run/ts/host.sock");
  EXPECT_EQ(ParseHostTarget("--host", "/run/ts/host.sock").value(), "unix:/run/ts/host.sock");
  EXPECT_EQ(ParseHostTarget("--host", "127.0.0.1:9000").value(), "127.0.0.1:9000");
  // A folder without operator.addr says what is missing; a relative unix: path is refused.
  TempDir empty;
  auto missing = ParseHostTarget("--host", empty.path());
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(missing.status().message(), HasSubstr("--host"));
  EXPECT_THAT(missing.status().message(), HasSubstr("operator.addr"));
  EXPECT_FALSE(ParseHostTarget("--host", "unix:relative.sock").ok());
  EXPECT_FALSE(ParseHostTarget("--host", "localhost").ok());
  EXPECT_FALSE(ParseHostTarget("--host", "/" + std::string(200, 'x')).ok());
  auto list = ParseHostTargetList("--hosts", dir.path() + ",unix:/run/ts/b.sock");
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_EQ(*list,
            (std::vector<std::string>{"unix:/srv/h1/data/host.sock", "unix:/run/ts/b.sock"}));
  // The same socket named two ways is one host.
  EXPECT_FALSE(ParseHostTargetList("--hosts", dir.path() + ",unix:/srv/h1/data/host.sock").ok());
}

// ---------------------------------------------------------------------------------------------
// JSON shapes.

TEST(JsonTest, ProtoJsonUsesFieldNamesStringsForUint64AndEnumNames) {
  pb::Shard shard;
  shard.set_id(7);
  shard.set_status(pb::SHARD_STATUS_OPEN);
  shard.set_escrow_held("300000");
  shard.set_total_weight(240);
  shard.mutable_spec()->set_run_spec_hash(std::string(32, '\x01'));
  shard.mutable_spec()->set_min_nodes(2);
  auto* r = shard.add_reservations();
  r->set_host("gonka1h");
  r->set_frozen_weight(100);
  nlohmann::json doc = nlohmann::json::parse(ProtoToJson(shard));
  EXPECT_EQ(doc["id"], "7");
  EXPECT_EQ(doc["status"], "SHARD_STATUS_OPEN");
  EXPECT_EQ(doc["escrow_held"], "300000");
  EXPECT_EQ(doc["total_weight"], "240");
  EXPECT_EQ(doc["closed_height"], "0") << "primitive fields are printed even when zero";
  EXPECT_EQ(doc["close_reason"], "CLOSE_REASON_UNSPECIFIED");
  EXPECT_EQ(doc["spec"]["min_nodes"], 2) << "uint32 stays a number";
  EXPECT_EQ(doc["spec"]["run_spec_hash"], "AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE=");
  EXPECT_EQ(doc["reservations"][0]["frozen_weight"], "100");
  EXPECT_FALSE(doc.contains("escrowHeld"));

  cosmos::base::abci::v1beta1::TxResponse tx;
  tx.set_txhash("AB");
  tx.set_code(9);
  tx.set_height(12);
  nlohmann::json tx_doc = nlohmann::json::parse(ProtoToJson(tx));
  EXPECT_EQ(tx_doc["code"], 9);
  EXPECT_EQ(tx_doc["height"], "12");
  EXPECT_EQ(tx_doc["raw_log"], "");
}

TEST(JsonTest, CosmosStyleAnyIsPrintedDecodedAndAnUnknownOneIsLeftOut) {
  cosmos::tx::v1beta1::Tx tx;
  tx.mutable_body()->set_memo("hello");
  cosmos::base::abci::v1beta1::TxResponse response;
  response.set_txhash("AB");
  response.mutable_tx()->set_type_url("/cosmos.tx.v1beta1.Tx");
  response.mutable_tx()->set_value(tx.SerializeAsString());
  nlohmann::json doc = nlohmann::json::parse(ProtoToJson(response));
  EXPECT_EQ(doc["tx"]["@type"], "/cosmos.tx.v1beta1.Tx");
  EXPECT_EQ(doc["tx"]["body"]["memo"], "hello");

  response.mutable_tx()->set_type_url("/some.future.v9.Msg");
  nlohmann::json fallback = nlohmann::json::parse(ProtoToJson(response));
  EXPECT_FALSE(fallback.contains("error")) << fallback;
  EXPECT_EQ(fallback["txhash"], "AB");
  EXPECT_FALSE(fallback.contains("tx"));
}

TEST(JsonTest, EventShape) {
  tendermint::abci::Event event;
  event.set_type("trainshard.payout");
  auto* a = event.add_attributes();
  a->set_key("shard_id");
  a->set_value("3");
  auto* b = event.add_attributes();
  b->set_key("amount");
  b->set_value("10");
  nlohmann::ordered_json doc = EventToJson(42, 5, event);
  // Keys in the documented order, attributes in the event's order.
  EXPECT_EQ(doc.dump(), R"({"height":"42","index":5,"type":"trainshard.payout",)"
                        R"("attributes":{"shard_id":"3","amount":"10"}})");
  EXPECT_EQ(ShortEnumName("SHARD_STATUS_OPEN", "SHARD_STATUS_"), "open");
}

TEST(JsonTest, InvalidUtf8FromAPeerStillPrintsOneDocument) {
  std::ostringstream out;
  std::ostringstream err;
  Context ctx(out, err);
  ctx.PrintJson({{"type", std::string("bad\xff\xfe")}});
  nlohmann::json doc = nlohmann::json::parse(out.str());
  EXPECT_TRUE(doc["type"].is_string());
}

// ---------------------------------------------------------------------------------------------
// Host commands against a real gRPC server playing a host sidecar.

class FakeSidecar final : public pb::HostOperator::Service, public pb::SettlementQuery::Service {
 public:
  // `events_per_height` events at each of heights 1..`heights`; pages hold at most `page_cap`.
  FakeSidecar(int heights, int events_per_height, uint32_t page_cap = 1000) : page_cap_(page_cap) {
    for (int h = 1; h <= heights; ++h) {
      for (int i = 0; i < events_per_height; ++i) {
        pb::FollowedEvent e;
        e.set_height(h);
        e.set_index(static_cast<uint32_t>(i));
        e.mutable_event()->set_type("trainshard.reservation_added");
        auto* attribute = e.mutable_event()->add_attributes();
        attribute->set_key("n");
        attribute->set_value(std::to_string(h * 1000 + i));
        e.set_action(i % 2 == 0 ? "record" : "ignore:not ours");
        events_.push_back(e);
      }
    }
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(static_cast<pb::HostOperator::Service*>(this));
    builder.RegisterService(static_cast<pb::SettlementQuery::Service*>(this));
    server_ = builder.BuildAndStart();
    TS_CHECK(server_ != nullptr);
  }
  ~FakeSidecar() override { server_->Shutdown(); }

  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  int list_calls() {
    absl::MutexLock lock(&mu_);
    return list_calls_;
  }

  grpc::Status Status(grpc::ServerContext*, const pb::HostStatusRequest*,
                      pb::HostStatusResponse* response) override {
    response->set_address("gonka1fake");
    response->set_cursor_height(77);
    response->set_follower_error("writing batch to /d/state: No space left on device");
    response->set_follower_error_since_unix_ms(1'700'000'000'000);
    response->set_records_path("/d/state");
    response->set_records_error("No space left on device");
    response->set_records_error_since_unix_ms(1'700'000'000'000);
    response->set_events_processed(events_.size());
    return grpc::Status::OK;
  }
  // Pages never split a height here only by accident: they cut at `limit` events.
  grpc::Status ListEvents(grpc::ServerContext*, const pb::ListEventsRequest* request,
                          pb::ListEventsResponse* response) override {
    {
      absl::MutexLock lock(&mu_);
      ++list_calls_;
    }
    for (const auto& e : events_) {
      if (e.height() < request->from_height()) continue;
      if (static_cast<uint32_t>(response->events_size()) >= std::min(request->limit(), page_cap_)) {
        break;
      }
      *response->add_events() = e;
    }
    return grpc::Status::OK;
  }
  grpc::Status Reserve(grpc::ServerContext*, const pb::ReserveRequest* request,
                       pb::ReserveResponse*) override {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "shard " + std::to_string(request->shard_id()) + " is not open");
  }
  grpc::Status GetSettlement(grpc::ServerContext*, const pb::GetSettlementRequest* request,
                             pb::GetSettlementResponse* response) override {
    if (request->shard_id() != 4) return grpc::Status(grpc::StatusCode::NOT_FOUND, "none");
    response->mutable_settlement()->set_shard_id(4);
    response->mutable_settlement()->set_refund("12");
    response->mutable_signature()->set_host("gonka1fake");
    response->mutable_signature()->set_signature(std::string(65, '\x02'));
    return grpc::Status::OK;
  }

 private:
  std::vector<pb::FollowedEvent> events_;
  uint32_t page_cap_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  absl::Mutex mu_;
  int list_calls_ ABSL_GUARDED_BY(mu_) = 0;
};

TEST(HostCommandsTest, EventsPagesThroughEverythingOnce) {
  // 3 events per height and 500 per page: pages end in the middle of a height.
  FakeSidecar sidecar(/*heights=*/400, /*events_per_height=*/3);
  CliResult r = Cli({"host", "events", "--host", sidecar.address(), "--json"});
  ASSERT_EQ(r.code, 0) << Describe(r);
  nlohmann::json doc = nlohmann::json::parse(r.out);
  const auto& events = doc.at("events");
  ASSERT_EQ(events.size(), 1200u);
  for (size_t k = 0; k < events.size(); ++k) {
    int64_t height = static_cast<int64_t>(k / 3) + 1;
    uint32_t index = static_cast<uint32_t>(k % 3);
    ASSERT_EQ(events[k]["height"], std::to_string(height)) << k;
    ASSERT_EQ(events[k]["index"], index) << k;
    ASSERT_EQ(events[k]["attributes"]["n"], std::to_string(height * 1000 + index));
    ASSERT_EQ(events[k]["action"], index % 2 == 0 ? "record" : "ignore:not ours");
    ASSERT_EQ(events[k]["type"], "trainshard.reservation_added");
  }
  EXPECT_GE(sidecar.list_calls(), 3);
  EXPECT_LE(sidecar.list_calls(), 4);

  CliResult from = Cli({"host", "events", "--host", sidecar.address(), "--from", "399"});
  ASSERT_EQ(from.code, 0) << Describe(from);
  EXPECT_EQ(std::count(from.out.begin(), from.out.end(), '\n'), 6);
}

TEST(HostCommandsTest, EventsWorkWithASidecarThatCapsPagesLower) {
  FakeSidecar sidecar(/*heights=*/100, /*events_per_height=*/7, /*page_cap=*/64);
  CliResult r = Cli({"host", "events", "--host", sidecar.address(), "--from", "1", "--json"});
  ASSERT_EQ(r.code, 0) << Describe(r);
  nlohmann::json doc = nlohmann::json::parse(r.out);
  const auto& events = doc.at("events");
  ASSERT_EQ(events.size(), 700u);
  EXPECT_EQ(events.back()["height"], "100");
  EXPECT_EQ(events.back()["index"], 6);
  EXPECT_EQ(r.err, "");
}

TEST(HostCommandsTest, AHeightLargerThanAPageDoesNotLoopForever) {
  FakeSidecar sidecar(/*heights=*/2, /*events_per_height=*/700);
  CliResult r = Cli({"host", "events", "--host", sidecar.address(), "--json"});
  ASSERT_EQ(r.code, 0) << Describe(r);
  EXPECT_THAT(r.err, HasSubstr("more than 500 events"));
  EXPECT_LE(sidecar.list_calls(), 6);
}

TEST(HostCommandsTest, StatusSettlementAndRefusals) {
  FakeSidecar sidecar(1, 1);
  CliResult status = Cli({"host", "status", "--host", sidecar.address(), "--json"});
  ASSERT_EQ(status.code, 0) << Describe(status);
  nlohmann::json doc = nlohmann::json::parse(status.out);
  EXPECT_EQ(doc["address"], "gonka1fake");
  EXPECT_EQ(doc["cursor_height"], "77");
  EXPECT_EQ(doc["pending_txs"], 0);

  EXPECT_EQ(doc["records_error"], "No space left on device");
  EXPECT_EQ(doc["follower_error_since_unix_ms"], "1700000000000");

  CliResult human = Cli({"host", "status", "--host", sidecar.address()});
  ASSERT_EQ(human.code, 0);
  EXPECT_THAT(human.out, HasSubstr("cursor_height:"));
  EXPECT_THAT(human.out,
              HasSubstr("stopped since 2023-11-14T22:13:20Z: writing batch to /d/state: No space"));
  EXPECT_THAT(human.out, HasSubstr("refusing writes since 2023-11-14T22:13:20Z"));
  EXPECT_THAT(human.out, HasSubstr("/d/state"));

  CliResult settlement = Cli({"host", "settlement", "--host", sidecar.address(), "--id", "4"});
  ASSERT_EQ(settlement.code, 0) << Describe(settlement);
  std::string signature_hex;
  for (int i = 0; i < 65; ++i) signature_hex += "02";
  EXPECT_THAT(settlement.out, HasSubstr(signature_hex));
  CliResult missing = Cli({"host", "settlement", "--host", sidecar.address(), "--id", "5"});
  EXPECT_EQ(missing.code, kExitRefused) << Describe(missing);
  EXPECT_THAT(missing.err, HasSubstr("NOT_FOUND"));

  CliResult reserve = Cli({"shard", "reserve", "--id", "9", "--host", sidecar.address()});
  EXPECT_EQ(reserve.code, kExitRefused) << Describe(reserve);
  EXPECT_THAT(reserve.err, HasSubstr("shard 9 is not open"));
  EXPECT_THAT(reserve.err, HasSubstr(sidecar.address()));
}

TEST(HostCommandsTest, UnreachableSidecarExitsThree) {
  CliResult r = Cli({"host", "shards", "--host", "127.0.0.1:1", "--timeout-ms", "2000"});
  EXPECT_EQ(r.code, kExitUnreachable) << Describe(r);
  EXPECT_THAT(r.err, HasSubstr("cannot reach"));
}

// ---------------------------------------------------------------------------------------------
// Artifact commands against a real gRPC server playing a host sidecar's artifact operator API.

class FakeArtifactHost final : public pb::ArtifactOperator::Service {
 public:
  static constexpr char kIdByte = '\xab';
  static constexpr char kFailingIdByte = '\xee';

  FakeArtifactHost() {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(this);
    server_ = builder.BuildAndStart();
    TS_CHECK(server_ != nullptr);
  }
  ~FakeArtifactHost() override { server_->Shutdown(); }

  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  pb::PublishArtifactRequest last_publish() {
    absl::MutexLock lock(&mu_);
    return publish_;
  }
  pb::FetchArtifactRequest last_fetch() {
    absl::MutexLock lock(&mu_);
    return fetch_;
  }
  pb::ListLocalArtifactsRequest last_list() {
    absl::MutexLock lock(&mu_);
    return list_;
  }
  pb::GcArtifactsRequest last_gc() {
    absl::MutexLock lock(&mu_);
    return gc_;
  }

  grpc::Status Publish(grpc::ServerContext*, const pb::PublishArtifactRequest* request,
                       grpc::ServerWriter<pb::ArtifactProgress>* writer) override {
    {
      absl::MutexLock lock(&mu_);
      publish_ = *request;
    }
    pb::ArtifactProgress p;
    p.set_phase("hashing");
    p.set_bytes_total(3 << 20);
    for (int i = 1; i <= 3; ++i) {
      p.set_bytes_done(static_cast<uint64_t>(i) << 20);
      writer->Write(p);
    }
    // A host that falls silent: the client gives up after --timeout-ms without a message.
    if (request->kind() == "silent") std::this_thread::sleep_for(std::chrono::seconds(3));
    p.set_phase("done");
    p.set_done(true);
    p.set_artifact_id(std::string(32, kIdByte));
    p.set_chunks_total(3);
    p.set_chunks_done(3);
    p.set_chunks_present(1);
    writer->Write(p);
    return grpc::Status::OK;
  }
  grpc::Status Fetch(grpc::ServerContext*, const pb::FetchArtifactRequest* request,
                     grpc::ServerWriter<pb::ArtifactProgress>* writer) override {
    {
      absl::MutexLock lock(&mu_);
      fetch_ = *request;
    }
    pb::ArtifactProgress p;
    p.set_phase("manifest");
    writer->Write(p);
    if (request->artifact_id() == std::string(32, kFailingIdByte)) {
      return grpc::Status(grpc::StatusCode::ABORTED,
                          "fetch incomplete (run it again to resume): no usable peer left: "
                          "gonka1peerone: unavailable: connection refused; gonka1peertwo: chunk "
                          "3f2a failed verification");
    }
    p.set_phase("done");
    p.set_done(true);
    p.set_artifact_id(request->artifact_id());
    p.set_bytes_total(5000);
    p.set_bytes_done(5000);
    p.set_bytes_fetched(4000);
    p.set_chunks_total(5);
    p.set_chunks_present(1);
    p.set_chunks_fetched(4);
    (*p.mutable_bytes_by_peer())["gonka1peerone"] = 4000;
    auto* fault = p.add_peer_faults();
    fault->set_peer("gonka1peertwo");
    fault->set_reason("chunk 3f2a failed verification");
    fault->set_corrupt(true);
    writer->Write(p);
    return grpc::Status::OK;
  }
  grpc::Status List(grpc::ServerContext*, const pb::ListLocalArtifactsRequest* request,
                    pb::ListArtifactsResponse* response) override {
    {
      absl::MutexLock lock(&mu_);
      list_ = *request;
    }
    auto* a = response->add_artifacts();
    a->set_artifact_id(std::string(32, kIdByte));
    a->set_shard_id(request->shard_id());
    a->set_round(4);
    a->set_kind("checkpoint");
    a->set_publisher("gonka1publisher");
    a->set_parent(std::string(32, '\x01'));
    a->set_total_bytes(5000);
    a->set_files(2);
    a->set_chunks(5);
    a->set_complete(true);
    if (request->include_incomplete()) {
      auto* b = response->add_artifacts();
      b->set_artifact_id(std::string(32, '\x02'));
      b->set_complete(false);
    }
    return grpc::Status::OK;
  }
  grpc::Status Verify(grpc::ServerContext*, const pb::VerifyArtifactsRequest* request,
                      pb::VerifyArtifactsResponse* response) override {
    response->set_artifacts_checked(2);
    response->set_chunks_ok(9);
    if (request->shard_id() == 2) {
      response->add_modified(std::string(64, 'c'));
      response->add_missing(std::string(64, 'd'));
    }
    response->add_unreferenced(std::string(64, 'e'));
    response->set_unreferenced_bytes(4096);
    return grpc::Status::OK;
  }
  grpc::Status Gc(grpc::ServerContext*, const pb::GcArtifactsRequest* request,
                  pb::GcArtifactsResponse* response) override {
    {
      absl::MutexLock lock(&mu_);
      gc_ = *request;
    }
    response->set_artifacts_dropped(static_cast<uint32_t>(request->drop_artifacts_size()));
    response->set_chunks_removed(7);
    response->set_bytes_freed(7000);
    return grpc::Status::OK;
  }

 private:
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  absl::Mutex mu_;
  pb::PublishArtifactRequest publish_ ABSL_GUARDED_BY(mu_);
  pb::FetchArtifactRequest fetch_ ABSL_GUARDED_BY(mu_);
  pb::ListLocalArtifactsRequest list_ ABSL_GUARDED_BY(mu_);
  pb::GcArtifactsRequest gc_ ABSL_GUARDED_BY(mu_);
};

std::string Repeat(const std::string& s, int n) {
  std::string out;
  for (int i = 0; i < n; ++i) out += s;
  return out;
}

TEST(ArtifactCommandsTest, PublishSendsTheDirectorysOwnPathAndPrintsHexJson) {
  FakeArtifactHost host;
  TempDir dir;
  std::filesystem::create_directories(dir.File("ckpt/sub"));
  std::filesystem::create_directory_symlink(dir.File("ckpt"), dir.File("link"));
  std::string parent(64, '0');
  parent[63] = 'F';
  CliResult r = Cli({"artifact", "publish", "--host", host.address(), "--shard", "3", "--dir",
                     dir.File("link/sub/.."), "--round", "12", "--parent", parent, "--kind", "eval",
                     "--chunk-size", "65536", "--json"});
  ASSERT_EQ(r.code, 0) << Describe(r);
  // Progress as JSON lines on stderr: the first update, then (the host's updates coming faster
  // than one a second) only the final line.
  std::vector<std::string> progress = absl::StrSplit(r.err, '\n', absl::SkipEmpty());
  ASSERT_EQ(progress.size(), 2u) << Describe(r);
  nlohmann::json first = nlohmann::json::parse(progress[0]);
  EXPECT_EQ(first["operation"], "publish");
  EXPECT_EQ(first["phase"], "hashing");
  EXPECT_EQ(first["done"], false);
  EXPECT_EQ(first["bytes_done"], 1 << 20);
  EXPECT_EQ(first["bytes_total"], 3 << 20);
  nlohmann::json last = nlohmann::json::parse(progress[1]);
  EXPECT_EQ(last["done"], true);
  EXPECT_EQ(last["bytes_done"], 3 << 20);
  EXPECT_EQ(last["eta_s"], 0);
  EXPECT_TRUE(last.contains("rate_bytes_per_s"));
  pb::PublishArtifactRequest sent = host.last_publish();
  EXPECT_EQ(sent.shard_id(), 3u);
  EXPECT_EQ(sent.source_dir(), std::filesystem::canonical(dir.File("ckpt")).string());
  EXPECT_EQ(sent.round(), 12u);
  EXPECT_EQ(common::HexEncode(sent.parent()), std::string(63, '0') + "f");
  EXPECT_EQ(sent.kind(), "eval");
  EXPECT_EQ(sent.chunk_size(), 65536u);

  nlohmann::json doc = nlohmann::json::parse(r.out);
  EXPECT_EQ(doc["artifact_id"], Repeat("ab", 32));
  EXPECT_EQ(doc["done"], true);
  EXPECT_EQ(doc["phase"], "done");
  EXPECT_EQ(doc["bytes_total"], std::to_string(3 << 20));
  EXPECT_EQ(doc["chunks_present"], 1);
  EXPECT_TRUE(doc.contains("peer_faults"));
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << "one JSON document";

  CliResult human = Cli(
      {"artifact", "publish", "--host", host.address(), "--shard", "3", "--dir", dir.File("ckpt")});
  ASSERT_EQ(human.code, 0) << Describe(human);
  EXPECT_THAT(human.out, HasSubstr("artifact_id:"));
  EXPECT_THAT(human.out, HasSubstr(Repeat("ab", 32)));
  EXPECT_THAT(human.err, HasSubstr("publish: hashing 33% 1.0 MiB / 3.0 MiB"))
      << "plain lines when stderr is not a terminal";
  EXPECT_THAT(human.err, HasSubstr("publish: done, 3.0 MiB in "));
  EXPECT_EQ(host.last_publish().kind(), "") << "the host's default kind";
  EXPECT_EQ(host.last_publish().chunk_size(), 0u) << "the host's default chunk size";
}

TEST(ArtifactCommandsTest, FetchPassesPeersAndAnAbsoluteOutAndReportsPeers) {
  FakeArtifactHost host;
  std::string peer_one = FreshAddress();
  std::string peer_two = FreshAddress();
  CliResult r =
      Cli({"artifact", "fetch", "--host", host.address(), "--shard", "3", "--id", Repeat("cd", 32),
           "--peer", peer_one, "--peer", peer_two, "--out", "relative/out", "--json"});
  ASSERT_EQ(r.code, 0) << Describe(r);
  pb::FetchArtifactRequest sent = host.last_fetch();
  EXPECT_EQ(sent.shard_id(), 3u);
  EXPECT_EQ(sent.artifact_id(), std::string(32, '\xcd'));
  ASSERT_EQ(sent.peers_size(), 2);
  EXPECT_EQ(sent.peers(0), peer_one);
  EXPECT_EQ(sent.peers(1), peer_two);
  EXPECT_EQ(sent.out_dir(), (std::filesystem::current_path() / "relative/out").string());
  nlohmann::json doc = nlohmann::json::parse(r.out);
  EXPECT_EQ(doc["artifact_id"], Repeat("cd", 32));
  EXPECT_EQ(doc["bytes_by_peer"]["gonka1peerone"], "4000");
  EXPECT_EQ(doc["peer_faults"][0]["peer"], "gonka1peertwo");
  EXPECT_EQ(doc["peer_faults"][0]["corrupt"], true);
  EXPECT_EQ(doc["chunks_fetched"], 4);

  CliResult human = Cli(
      {"artifact", "fetch", "--host", host.address(), "--shard", "3", "--id", Repeat("cd", 32)});
  ASSERT_EQ(human.code, 0) << Describe(human);
  EXPECT_EQ(host.last_fetch().peers_size(), 0) << "no --peer: the host asks every member";
  EXPECT_EQ(host.last_fetch().out_dir(), "");
  EXPECT_THAT(human.out, HasSubstr("bytes_fetched:"));
  EXPECT_THAT(human.out, HasSubstr("gonka1peerone"));
  EXPECT_THAT(human.err, HasSubstr("warning: peer gonka1peertwo (corrupt)"));
  EXPECT_THAT(human.err, HasSubstr("fetch: manifest\n"));
  EXPECT_THAT(human.err, HasSubstr("fetch: done, 4.9 KiB in "));
}

TEST(ArtifactCommandsTest, AFailedFetchNamesEveryDroppedPeerAndExitsOne) {
  FakeArtifactHost host;
  CliResult r = Cli({"artifact", "fetch", "--host", host.address(), "--shard", "3", "--id",
                     Repeat("ee", 32), "--json"});
  EXPECT_EQ(r.code, kExitRefused) << Describe(r);
  EXPECT_EQ(r.out, "");
  EXPECT_THAT(r.err, HasSubstr("ABORTED"));
  EXPECT_THAT(r.err, HasSubstr("gonka1peerone: unavailable"));
  EXPECT_THAT(r.err, HasSubstr("gonka1peertwo: chunk 3f2a failed verification"));
  EXPECT_THAT(r.err, Not(HasSubstr("cannot reach")));
}

TEST(ArtifactCommandsTest, ListPrintsHexIdsAndParents) {
  FakeArtifactHost host;
  CliResult r = Cli({"artifact", "list", "--host", host.address(), "--shard", "5", "--json"});
  ASSERT_EQ(r.code, 0) << Describe(r);
  EXPECT_FALSE(host.last_list().include_incomplete());
  nlohmann::json doc = nlohmann::json::parse(r.out);
  ASSERT_EQ(doc["artifacts"].size(), 1u);
  EXPECT_EQ(doc["artifacts"][0]["artifact_id"], Repeat("ab", 32));
  EXPECT_EQ(doc["artifacts"][0]["parent"], Repeat("01", 32));
  EXPECT_EQ(doc["artifacts"][0]["round"], "4");
  EXPECT_EQ(doc["artifacts"][0]["complete"], true);

  CliResult all = Cli({"artifact", "list", "--host", host.address(), "--shard", "5", "--all"});
  ASSERT_EQ(all.code, 0) << Describe(all);
  EXPECT_TRUE(host.last_list().include_incomplete());
  EXPECT_THAT(all.out, HasSubstr("incomplete"));
  EXPECT_THAT(all.out, HasSubstr(Repeat("02", 32)));
}

TEST(ArtifactCommandsTest, VerifyExitsOneOnDamageAndPrintsTheReport) {
  FakeArtifactHost host;
  CliResult clean = Cli({"artifact", "verify", "--host", host.address(), "--shard", "1", "--json"});
  ASSERT_EQ(clean.code, 0) << Describe(clean);
  nlohmann::json doc = nlohmann::json::parse(clean.out);
  EXPECT_EQ(doc["chunks_ok"], 9);
  EXPECT_EQ(doc["unreferenced"][0], std::string(64, 'e'));
  EXPECT_EQ(doc["unreferenced_bytes"], "4096");
  EXPECT_TRUE(doc["modified"].empty());
  // Unreferenced chunks are not damage (exit 0), but the store is not called clean.
  CliResult text = Cli({"artifact", "verify", "--host", host.address(), "--shard", "1"});
  ASSERT_EQ(text.code, 0) << Describe(text);
  EXPECT_THAT(text.out, HasSubstr("unreferenced_bytes:"));
  EXPECT_THAT(text.out, HasSubstr("1 unreferenced chunks holding 4096 bytes"));
  EXPECT_THAT(text.out, ::testing::Not(HasSubstr("clean")));

  CliResult damaged =
      Cli({"artifact", "verify", "--host", host.address(), "--shard", "2", "--json"});
  EXPECT_EQ(damaged.code, kExitRefused) << Describe(damaged);
  nlohmann::json report = nlohmann::json::parse(damaged.out);
  EXPECT_EQ(report["modified"][0], std::string(64, 'c'));
  EXPECT_EQ(report["missing"][0], std::string(64, 'd'));
  EXPECT_THAT(damaged.err, HasSubstr("damaged"));
}

TEST(ArtifactCommandsTest, GcPassesDropsAndPrintsCounts) {
  FakeArtifactHost host;
  CliResult r =
      Cli({"artifact", "gc", "--host", host.address(), "--shard", "1", "--drop-incomplete",
           "--drop", Repeat("ab", 32), "--drop", Repeat("CD", 32), "--json"});
  ASSERT_EQ(r.code, 0) << Describe(r);
  pb::GcArtifactsRequest sent = host.last_gc();
  EXPECT_TRUE(sent.drop_incomplete());
  ASSERT_EQ(sent.drop_artifacts_size(), 2);
  EXPECT_EQ(sent.drop_artifacts(1), std::string(32, '\xcd'));
  nlohmann::json doc = nlohmann::json::parse(r.out);
  EXPECT_EQ(doc["artifacts_dropped"], 2);
  EXPECT_EQ(doc["bytes_freed"], "7000");
}

TEST(ArtifactCommandsTest, ASilentHostIsGivenUpOnAfterTimeoutMs) {
  FakeArtifactHost host;
  TempDir dir;
  CliResult r = Cli({"artifact", "publish", "--host", host.address(), "--shard", "1", "--dir",
                     dir.path(), "--kind", "silent", "--timeout-ms", "500"});
  EXPECT_EQ(r.code, kExitUnreachable) << Describe(r);
  EXPECT_THAT(r.err, HasSubstr("no progress for 500 ms"));
}

TEST(ArtifactCommandsTest, UnreachableHostExitsThree) {
  TempDir dir;
  CliResult r = Cli({"artifact", "publish", "--host", "127.0.0.1:1", "--shard", "1", "--dir",
                     dir.path(), "--timeout-ms", "2000"});
  EXPECT_EQ(r.code, kExitUnreachable) << Describe(r);
  EXPECT_THAT(r.err, HasSubstr("cannot reach"));
  CliResult list = Cli({"artifact", "list", "--host", "127.0.0.1:1", "--shard", "1"});
  EXPECT_EQ(list.code, kExitUnreachable) << Describe(list);
}

}  // namespace
}  // namespace ts::sidecar
