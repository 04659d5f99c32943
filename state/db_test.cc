#include "state/db.h"

#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "google/protobuf/wrappers.pb.h"
#include "gtest/gtest.h"
#include "tests/util/small_tmpfs.h"

namespace ts::state {
namespace {

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "ts_state_test.XXXXXX").string();
    char* made = mkdtemp(tmpl.data());
    EXPECT_NE(made, nullptr);
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string Sub(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

DbOptions TwoTables() {
  DbOptions o;
  o.tables = {"alpha", "beta"};
  return o;
}

std::vector<std::pair<std::string, std::string>> Collect(const Db& db, std::string_view table,
                                                         std::string_view prefix,
                                                         std::string_view start = {}) {
  std::vector<std::pair<std::string, std::string>> out;
  auto fn = [&](std::string_view k, std::string_view v) {
    out.emplace_back(std::string(k), std::string(v));
    return true;
  };
  absl::Status s =
      start.empty() ? db.Scan(table, prefix, fn) : db.ScanFrom(table, prefix, start, fn);
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

TEST(DbTest, ReopenKeepsData) {
  TempDir dir;
  {
    auto db = Db::Open(dir.Sub("db"), TwoTables());
    ASSERT_TRUE(db.ok()) << db.status();
    WriteBatch b;
    b.Put("alpha", "k1", "v1");
    b.Put("beta", "k1", "other");
    ASSERT_TRUE((*db)->Write(b).ok());
  }
  auto db = Db::Open(dir.Sub("db"), TwoTables());
  ASSERT_TRUE(db.ok()) << db.status();
  EXPECT_EQ(*(*db)->Get("alpha", "k1"), "v1");
  EXPECT_EQ(*(*db)->Get("beta", "k1"), "other");
  EXPECT_EQ((*db)->Get("alpha", "k2").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ((*db)->path(), dir.Sub("db"));
}

TEST(DbTest, ReopenWithFewerTablesStillOpens) {
  TempDir dir;
  ASSERT_TRUE(Db::Open(dir.Sub("db"), TwoTables()).ok());
  DbOptions one;
  one.tables = {"alpha"};
  auto db = Db::Open(dir.Sub("db"), one);
  ASSERT_TRUE(db.ok()) << db.status();
  EXPECT_EQ((*db)->Get("beta", "x").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(DbTest, BatchIsAtomicWhenOneOpIsBad) {
  TempDir dir;
  auto db = Db::Open(dir.Sub("db"), TwoTables());
  ASSERT_TRUE(db.ok());
  WriteBatch b;
  b.Put("alpha", "a", "1");
  b.Put("nosuch", "b", "2");
  EXPECT_EQ(b.size(), 2u);
  absl::Status s = (*db)->Write(b);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("nosuch"), std::string::npos) << s;
  // Nothing of the refused batch was applied.
  EXPECT_EQ((*db)->Get("alpha", "a").status().code(), absl::StatusCode::kNotFound);
}

TEST(DbTest, BatchAppliesPutsAndDeletesTogether) {
  TempDir dir;
  auto db = Db::Open(dir.Sub("db"), TwoTables());
  ASSERT_TRUE(db.ok());
  WriteBatch first;
  first.Put("alpha", "a", "1");
  first.Put("alpha", "b", "2");
  ASSERT_TRUE((*db)->Write(first).ok());
  WriteBatch second;
  second.Delete("alpha", "a");
  second.Put("alpha", "b", "3");
  second.Put("beta", "c", "4");
  ASSERT_TRUE((*db)->Write(second, /*sync=*/false).ok());
  EXPECT_EQ((*db)->Get("alpha", "a").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(*(*db)->Get("alpha", "b"), "3");
  EXPECT_EQ(*(*db)->Get("beta", "c"), "4");
}

TEST(DbTest, SchemaMismatchRefused) {
  TempDir dir;
  DbOptions v1 = TwoTables();
  ASSERT_TRUE(Db::Open(dir.Sub("db"), v1).ok());
  DbOptions v2 = TwoTables();
  v2.schema_version = 2;
  auto db = Db::Open(dir.Sub("db"), v2);
  EXPECT_EQ(db.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(db.status().message().find("schema_version 1"), std::string::npos) << db.status();
  EXPECT_TRUE(Db::Open(dir.Sub("db"), v1).ok());
}

TEST(DbTest, ScansAreOrderedAndBoundedByPrefix) {
  TempDir dir;
  auto db = Db::Open(dir.Sub("db"), TwoTables());
  ASSERT_TRUE(db.ok());
  WriteBatch b;
  for (uint64_t h : {300u, 2u, 70000u, 1u}) b.Put("alpha", "h/" + EncodeU64Key(h), "x");
  b.Put("alpha", "g", "before");
  b.Put("alpha", "i", "after");
  b.Put("alpha", std::string("h\xff"), "0xff");
  b.Put("beta", "h/zzz", "other table");
  ASSERT_TRUE((*db)->Write(b).ok());

  auto rows = Collect(**db, "alpha", "h/");
  ASSERT_EQ(rows.size(), 4u);
  std::vector<uint64_t> heights;
  for (const auto& [k, v] : rows) heights.push_back(DecodeU64Key(k.substr(2)));
  EXPECT_EQ(heights, (std::vector<uint64_t>{1, 2, 300, 70000}));

  auto from = Collect(**db, "alpha", "h/", "h/" + EncodeU64Key(3));
  ASSERT_EQ(from.size(), 2u);
  EXPECT_EQ(DecodeU64Key(from[0].first.substr(2)), 300u);

  // A prefix ending in 0xff has no simple successor; the prefix check bounds it.
  auto ff = Collect(**db, "alpha", std::string("h\xff"));
  ASSERT_EQ(ff.size(), 1u);
  EXPECT_EQ(ff[0].second, "0xff");

  auto all = Collect(**db, "alpha", "");
  EXPECT_EQ(all.size(), 7u);
  EXPECT_EQ(all.front().first, "g");

  int seen = 0;
  ASSERT_TRUE((*db)
                  ->Scan("alpha", "h/",
                         [&](std::string_view, std::string_view) {
                           ++seen;
                           return seen < 2;
                         })
                  .ok());
  EXPECT_EQ(seen, 2);
}

TEST(DbTest, UnknownTableRefused) {
  TempDir dir;
  auto db = Db::Open(dir.Sub("db"), TwoTables());
  ASSERT_TRUE(db.ok());
  EXPECT_EQ((*db)->Get("gamma", "k").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*db)->Scan("gamma", "", [](auto, auto) { return true; }).code(),
            absl::StatusCode::kInvalidArgument);
  // The schema version lives in "default", which is not a table.
  EXPECT_EQ((*db)->Get("default", "schema_version").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(DbTest, BadTableNamesRefused) {
  TempDir dir;
  for (std::vector<std::string> tables : std::vector<std::vector<std::string>>{
           {""}, {"default"}, {"Upper"}, {"a", "a"}, {std::string(65, 'a')}}) {
    DbOptions o;
    o.tables = tables;
    EXPECT_EQ(Db::Open(dir.Sub("db"), o).status().code(), absl::StatusCode::kInvalidArgument);
  }
}

TEST(DbTest, ProtoRoundTripAndCorruptValueIsDataLoss) {
  TempDir dir;
  auto db = Db::Open(dir.Sub("db"), TwoTables());
  ASSERT_TRUE(db.ok());
  google::protobuf::StringValue v;
  v.set_value("hello");
  WriteBatch b;
  b.PutProto("alpha", "good", v);
  b.Put("alpha", "bad", std::string("\xff\xff\xff\xff", 4));
  ASSERT_TRUE((*db)->Write(b).ok());

  google::protobuf::StringValue out;
  ASSERT_TRUE((*db)->GetProto("alpha", "good", &out).ok());
  EXPECT_EQ(out.value(), "hello");
  EXPECT_EQ((*db)->GetProto("alpha", "bad", &out).code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ((*db)->GetProto("alpha", "none", &out).code(), absl::StatusCode::kNotFound);
}

TEST(DbTest, SecondOpenWhileLockedIsUnavailable) {
  TempDir dir;
  auto db = Db::Open(dir.Sub("db"), TwoTables());
  ASSERT_TRUE(db.ok());
  // RocksDB's LOCK is an fcntl lock, which a second open in the same process also meets
  // (RocksDB tracks its own locked files per process).
  auto again = Db::Open(dir.Sub("db"), TwoTables());
  EXPECT_EQ(again.status().code(), absl::StatusCode::kUnavailable) << again.status();
}

TEST(DbTest, MissingDatabaseWithoutCreateIsNotFound) {
  TempDir dir;
  DbOptions o = TwoTables();
  o.create_if_missing = false;
  EXPECT_EQ(Db::Open(dir.Sub("nothing"), o).status().code(), absl::StatusCode::kNotFound);
}

class FakeClock final : public common::Clock {
 public:
  int64_t NowUnixMs() override { return 1'700'000'000'000 + now_ms_; }
  int64_t MonotonicMs() override { return now_ms_; }
  void SleepMs(int64_t ms) override { now_ms_ += ms; }
  void Advance(int64_t ms) { now_ms_ += ms; }

 private:
  int64_t now_ms_ = 5000;
};

absl::Status PutOne(Db& db, const std::string& key, const std::string& value) {
  WriteBatch b;
  b.Put("alpha", key, value);
  return db.Write(b);
}

TEST(DbTest, FullDiskRefusesWritesKeepsReadsAndRecoversByItself) {
  TempDir dir;
  FakeClock clock;
  auto fault = std::make_shared<DiskFullFault>();
  DbOptions options = TwoTables();
  options.clock = &clock;
  options.disk_full_fault = fault;
  auto db = Db::Open(dir.Sub("db"), options);
  ASSERT_TRUE(db.ok()) << db.status();
  ASSERT_TRUE(PutOne(**db, "before", "1").ok());
  EXPECT_TRUE((*db)->Health().error.ok());
  EXPECT_EQ((*db)->Health().since_unix_ms, 0);

  fault->Set(true);
  absl::Status refused = PutOne(**db, "during", "2");
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  DbHealth health = (*db)->Health();
  EXPECT_EQ(health.error.code(), absl::StatusCode::kResourceExhausted) << health.error;
  EXPECT_NE(health.error.message().find(dir.Sub("db")), std::string::npos) << health.error;
  EXPECT_EQ(health.since_unix_ms, clock.NowUnixMs());
  EXPECT_EQ(health.recoveries, 0u);
  // Reads go on while writes are refused.
  EXPECT_EQ(*(*db)->Get("alpha", "before"), "1");
  clock.Advance(5000);
  EXPECT_EQ(PutOne(**db, "during", "3").code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ((*db)->Health().since_unix_ms, health.since_unix_ms);

  // Space is back: the next write due for a recovery reopens the database and succeeds.
  fault->Set(false);
  clock.Advance(1000);
  absl::Status after = PutOne(**db, "after", "4");
  ASSERT_TRUE(after.ok()) << after;
  health = (*db)->Health();
  EXPECT_TRUE(health.error.ok()) << health.error;
  EXPECT_EQ(health.since_unix_ms, 0);
  EXPECT_EQ(health.recoveries, 1u);
  EXPECT_EQ(*(*db)->Get("alpha", "before"), "1");
  EXPECT_EQ(*(*db)->Get("alpha", "after"), "4");
  EXPECT_EQ((*db)->Get("alpha", "during").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(Collect(**db, "alpha", "").size(), 2u);

  // What was written survives a restart.
  db->reset();
  auto again = Db::Open(dir.Sub("db"), TwoTables());
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*(*again)->Get("alpha", "before"), "1");
  EXPECT_EQ(*(*again)->Get("alpha", "after"), "4");
}

TEST(DbTest, RecoveryIsTriedAtMostOncePerInterval) {
  TempDir dir;
  FakeClock clock;
  auto fault = std::make_shared<DiskFullFault>();
  DbOptions options = TwoTables();
  options.clock = &clock;
  options.disk_full_fault = fault;
  options.recovery_interval_ms = 1000;
  auto db = Db::Open(dir.Sub("db"), options);
  ASSERT_TRUE(db.ok()) << db.status();
  fault->Set(true);
  EXPECT_FALSE(PutOne(**db, "a", "1").ok());  // the failure's own attempt finds no room
  fault->Set(false);
  clock.Advance(999);
  EXPECT_EQ(PutOne(**db, "b", "2").code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ((*db)->Health().recoveries, 0u);
  clock.Advance(1);
  ASSERT_TRUE(PutOne(**db, "c", "3").ok());
  EXPECT_EQ((*db)->Health().recoveries, 1u);
}

TEST(DbTest, RecoveryWaitsUntilTheFilesystemHasRoom) {
  TempDir dir;
  FakeClock clock;
  auto fault = std::make_shared<DiskFullFault>();
  DbOptions options = TwoTables();
  options.clock = &clock;
  options.disk_full_fault = fault;
  // More than any filesystem here has free.
  options.recovery_free_bytes_min = uint64_t{1} << 62;
  auto db = Db::Open(dir.Sub("db"), options);
  ASSERT_TRUE(db.ok()) << db.status();
  fault->Set(true);
  EXPECT_FALSE(PutOne(**db, "a", "1").ok());
  fault->Set(false);
  for (int i = 0; i < 3; ++i) {
    clock.Advance(2000);
    EXPECT_EQ(PutOne(**db, "b", "2").code(), absl::StatusCode::kResourceExhausted);
  }
  EXPECT_EQ((*db)->Health().error.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ((*db)->Health().recoveries, 0u);
  // Never closed meanwhile: reads work.
  EXPECT_EQ((*db)->Get("alpha", "a").status().code(), absl::StatusCode::kNotFound);
}

// The same on a real filesystem: a tmpfs filled to the last page, then freed. Before the Db
// recovered by itself, every write after the first ENOSPC failed forever (or RocksDB's LOG
// writer aborted the process).
TEST(DbTest, RealFullFilesystemRecoversOnceSpaceIsFreed) {
  std::string why;
  auto tmpfs = test_util::SmallTmpfs::Mount(4 << 20, &why);
  if (tmpfs == nullptr) GTEST_SKIP() << why;
  const std::string path = (tmpfs->path() / "db").string();
  DbOptions options = TwoTables();
  options.recovery_interval_ms = 0;
  options.recovery_free_bytes_min = 64 << 10;
  auto db = Db::Open(path, options);
  ASSERT_TRUE(db.ok()) << db.status();
  ASSERT_TRUE(PutOne(**db, "before", "1").ok());
  ASSERT_GT(tmpfs->Fill(), 0u);
  const std::string value(1000, 'v');
  int acknowledged = 0;
  absl::Status refused;
  for (int i = 0; i < 100000 && refused.ok(); ++i) {
    refused = PutOne(**db, "k" + std::to_string(i), value);
    if (refused.ok()) ++acknowledged;
  }
  ASSERT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_EQ((*db)->Health().error.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(PutOne(**db, "still", "full").code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(*(*db)->Get("alpha", "before"), "1");

  tmpfs->Free();
  absl::Status after = PutOne(**db, "after", "2");
  ASSERT_TRUE(after.ok()) << after;
  EXPECT_TRUE((*db)->Health().error.ok());
  EXPECT_EQ((*db)->Health().recoveries, 1u);
  db->reset();
  auto again = Db::Open(path, TwoTables());
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*(*again)->Get("alpha", "before"), "1");
  EXPECT_EQ(*(*again)->Get("alpha", "after"), "2");
  for (int i = 0; i < acknowledged; ++i) {
    EXPECT_TRUE((*again)->Get("alpha", "k" + std::to_string(i)).ok()) << "acknowledged k" << i;
  }
}

TEST(DbTest, U64KeysSortNumerically) {
  EXPECT_LT(EncodeU64Key(255), EncodeU64Key(256));
  EXPECT_EQ(EncodeU64Key(1).size(), 8u);
  EXPECT_EQ(DecodeU64Key(EncodeU64Key(0x0102030405060708ull)), 0x0102030405060708ull);
}

}  // namespace
}  // namespace ts::state
