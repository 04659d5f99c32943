// Unit tests of the trainshard CLI run in-process: flag errors (exit 2 naming the flag), key
// files, ADDR=AMOUNT parsing and JSON shapes. The host and artifact commands against servers that
// play a host sidecar are in cli_host_test.cc.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "common/crypto/bech32.h"
#include "common/crypto/secp256k1.h"
#include "common/hex.h"
#include "common/key_file.h"
#include "common/status.h"
#include "cosmos/base/abci/v1beta1/abci.pb.h"
#include "cosmos/tx/v1beta1/tx.pb.h"
#include "gmock/gmock.h"
#include "gonka/trainshard/v1/chain.pb.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "sidecar/cli/cli_test_util.h"
#include "sidecar/cli/context.h"
#include "sidecar/cli/output.h"
#include "sidecar/cli/parse.h"
#include "tendermint/abci/types.pb.h"

namespace ts::sidecar {
namespace {

namespace pb = ::gonka::trainshard::v1;
using cli_testing::AddressOf;
using cli_testing::Cli;
using cli_testing::CliResult;
using cli_testing::Describe;
using cli_testing::FreshAddress;
using cli_testing::TempDir;
using ::testing::HasSubstr;
using ::testing::Not;

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

}  // namespace
}  // namespace ts::sidecar
