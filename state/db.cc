#include "state/db.h"

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <limits>
#include <map>
#include <set>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/log.h"
#include "common/status.h"
#include "rocksdb/db.h"
#include "rocksdb/env.h"
#include "rocksdb/file_system.h"
#include "rocksdb/listener.h"
#include "rocksdb/options.h"
#include "rocksdb/slice.h"
#include "rocksdb/write_batch.h"
#include "state/disk_full_fs.h"

namespace ts::state {
namespace {

constexpr std::string_view kSchemaVersionKey = "schema_version";
constexpr size_t kTableNameMax = 64;

rocksdb::Slice ToSlice(std::string_view s) { return rocksdb::Slice(s.data(), s.size()); }
std::string_view ToView(const rocksdb::Slice& s) { return std::string_view(s.data(), s.size()); }
// Debian's Abseil is built with its own string_view, which StrCat needs.
absl::string_view Sv(std::string_view s) { return absl::string_view(s.data(), s.size()); }

constexpr std::string_view kComponent = "state";

absl::Status FromRocks(const rocksdb::Status& s, std::string_view what) {
  if (s.ok()) return absl::OkStatus();
  std::string message = absl::StrCat(Sv(what), ": ", s.ToString());
  if (s.IsNotFound()) return absl::NotFoundError(message);
  if (s.IsNoSpace()) return absl::ResourceExhaustedError(message);
  // RocksDB reports a held LOCK file as an I/O error; another process owns the database.
  if (s.IsIOError() && absl::AsciiStrToLower(s.ToString()).find("lock") != std::string::npos) {
    return absl::UnavailableError(message);
  }
  return absl::InternalError(message);
}

absl::Status ValidateTableName(std::string_view name) {
  if (name.empty() || name.size() > kTableNameMax) {
    return absl::InvalidArgumentError(absl::StrCat("options.tables: table name \"", Sv(name),
                                                   "\" must be 1..", kTableNameMax, " characters"));
  }
  for (char c : name) {
    if (!(absl::ascii_islower(c) || absl::ascii_isdigit(c) || c == '_')) {
      return absl::InvalidArgumentError(absl::StrCat("options.tables: table name \"", Sv(name),
                                                     "\" has a character outside [a-z0-9_]"));
    }
  }
  if (name == rocksdb::kDefaultColumnFamilyName) {
    return absl::InvalidArgumentError(
        "options.tables: \"default\" is reserved for the schema version");
  }
  return absl::OkStatus();
}

// An error after which RocksDB refuses writes until it is recovered: I/O errors (a full disk
// among them). Anything else (a bad argument, a missing key) says nothing about the database.
bool NeedsRecovery(const rocksdb::Status& s) { return s.IsIOError(); }

// RocksDB's own log, sent to the process log instead of a LOG file in the database directory.
// On a full filesystem the LOG is among the first files to fail, and Debian's RocksDB 7.8
// (built with its assertions on) aborts the process at the next line logged to a file whose
// write failed.
class RocksLogger final : public rocksdb::Logger {
 public:
  explicit RocksLogger(std::string path)
      : rocksdb::Logger(rocksdb::InfoLogLevel::WARN_LEVEL), path_(std::move(path)) {}

  using rocksdb::Logger::Logv;
  void Logv(const rocksdb::InfoLogLevel level, const char* format, va_list ap) override {
    if (level < GetInfoLogLevel() || level == rocksdb::InfoLogLevel::HEADER_LEVEL) return;
    char line[1024];
    std::vsnprintf(line, sizeof(line), format, ap);
    common::Log(level >= rocksdb::InfoLogLevel::ERROR_LEVEL ? common::LogLevel::kWarn
                                                            : common::LogLevel::kDebug,
                kComponent, "rocksdb", {{"db", path_}, {"detail", line}});
  }

 private:
  const std::string path_;
};

// Records the background errors RocksDB raises (a failed flush or compaction, a failed log
// write) and turns off RocksDB's own recovery, which the Db does by reopening instead.
class HealthListener final : public rocksdb::EventListener {
 public:
  explicit HealthListener(std::function<void(const rocksdb::Status&)> on_error)
      : on_error_(std::move(on_error)) {}
  void OnBackgroundError(rocksdb::BackgroundErrorReason, rocksdb::Status* error) override {
    if (error != nullptr && !error->ok()) on_error_(*error);
  }
  void OnErrorRecoveryBegin(rocksdb::BackgroundErrorReason, rocksdb::Status error,
                            bool* auto_recovery) override {
    error.PermitUncheckedError();
    *auto_recovery = false;
  }

 private:
  const std::function<void(const rocksdb::Status&)> on_error_;
};

// Smallest key greater than every key starting with `prefix`; empty if there is none (the
// prefix is empty or all 0xff bytes), meaning "no upper bound".
std::string PrefixSuccessor(std::string_view prefix) {
  std::string bound(prefix);
  while (!bound.empty()) {
    unsigned char last = static_cast<unsigned char>(bound.back());
    if (last != 0xff) {
      bound.back() = static_cast<char>(last + 1);
      return bound;
    }
    bound.pop_back();
  }
  return bound;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// WriteBatch

WriteBatch::WriteBatch() = default;
WriteBatch::~WriteBatch() = default;
WriteBatch::WriteBatch(WriteBatch&&) noexcept = default;
WriteBatch& WriteBatch::operator=(WriteBatch&&) noexcept = default;

void WriteBatch::Put(std::string_view table, std::string_view key, std::string_view value) {
  ops_.push_back(Op{std::string(table), std::string(key), std::string(value)});
}

void WriteBatch::PutProto(std::string_view table, std::string_view key,
                          const google::protobuf::MessageLite& value) {
  ops_.push_back(Op{std::string(table), std::string(key), value.SerializeAsString()});
}

void WriteBatch::Delete(std::string_view table, std::string_view key) {
  ops_.push_back(Op{std::string(table), std::string(key), std::nullopt});
}

size_t WriteBatch::size() const { return ops_.size(); }

// ---------------------------------------------------------------------------------------------
// Db

struct Db::Impl {
  Impl(std::string db_path, DbOptions db_options)
      : path(std::move(db_path)),
        options(std::move(db_options)),
        clock(options.clock != nullptr ? options.clock : &common::SystemClock()) {
    if (options.disk_full_fault != nullptr) {
      fs = NewDiskFullFileSystem(options.disk_full_fault);
      env = rocksdb::NewCompositeEnv(fs);
    } else {
      fs = rocksdb::FileSystem::Default();
    }
    logger = std::make_shared<RocksLogger>(path);
    listener = std::make_shared<HealthListener>([this](const rocksdb::Status& error) {
      NoteError(FromRocks(error, absl::StrCat("database ", path, ": background error")));
    });
  }

  ~Impl() {
    absl::MutexLock lock(&mu);
    CloseLocked();
  }

  const std::string path;
  const DbOptions options;
  common::Clock* const clock;
  std::shared_ptr<rocksdb::FileSystem> fs;
  std::unique_ptr<rocksdb::Env> env;  // wraps `fs` when it is not the default
  std::shared_ptr<rocksdb::Logger> logger;
  std::shared_ptr<HealthListener> listener;

  // Held shared by every use of the open database (a Scan for its whole iteration), exclusively
  // while the database is closed and opened again.
  mutable absl::Mutex mu;
  std::unique_ptr<rocksdb::DB> db ABSL_GUARDED_BY(mu);
  // Every open handle (RocksDB requires opening all existing column families); only the ones
  // named in DbOptions::tables are reachable through `tables`.
  std::vector<rocksdb::ColumnFamilyHandle*> handles ABSL_GUARDED_BY(mu);
  std::map<std::string, rocksdb::ColumnFamilyHandle*, std::less<>> tables ABSL_GUARDED_BY(mu);
  rocksdb::ColumnFamilyHandle* default_cf ABSL_GUARDED_BY(mu) = nullptr;

  // A leaf lock: RocksDB's threads take it (HealthListener), so nothing is called under it.
  mutable absl::Mutex health_mu;
  absl::Status error ABSL_GUARDED_BY(health_mu);
  int64_t error_since_unix_ms ABSL_GUARDED_BY(health_mu) = 0;
  int64_t error_since_ms ABSL_GUARDED_BY(health_mu) = 0;  // monotonic
  uint64_t recoveries ABSL_GUARDED_BY(health_mu) = 0;
  std::optional<int64_t> last_attempt_ms ABSL_GUARDED_BY(health_mu);

  rocksdb::Options RocksOptions() const {
    rocksdb::Options o;
    o.create_if_missing = options.create_if_missing;
    o.create_missing_column_families = true;
    // Keep open files bounded; the databases here are small and many processes share a host.
    o.max_open_files = 512;
    o.paranoid_checks = true;
    if (env != nullptr) o.env = env.get();
    o.info_log = logger;
    o.info_log_level = rocksdb::InfoLogLevel::WARN_LEVEL;
    o.listeners.push_back(listener);
    return o;
  }

  // Opens the RocksDB database and checks (or writes) the schema version. On error nothing is
  // left open.
  absl::Status OpenLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    const rocksdb::Options db_options = RocksOptions();
    // Made here, so RocksDB does not log an error about a directory it is about to create.
    if (options.create_if_missing) {
      fs->CreateDirIfMissing(path, rocksdb::IOOptions(), nullptr).PermitUncheckedError();
    }
    // RocksDB must open every column family already in the database.
    std::vector<std::string> existing;
    rocksdb::Status list = rocksdb::DB::ListColumnFamilies(db_options, path, &existing);
    if (!list.ok()) existing.clear();  // a new database: nothing to list yet
    std::set<std::string, std::less<>> wanted(options.tables.begin(), options.tables.end());
    std::set<std::string, std::less<>> all(wanted.begin(), wanted.end());
    all.insert(existing.begin(), existing.end());
    all.insert(rocksdb::kDefaultColumnFamilyName);

    std::vector<rocksdb::ColumnFamilyDescriptor> descriptors;
    for (const std::string& name : all) {
      descriptors.emplace_back(name, rocksdb::ColumnFamilyOptions(db_options));
    }
    rocksdb::DB* raw = nullptr;
    rocksdb::Status s = rocksdb::DB::Open(db_options, path, descriptors, &handles, &raw);
    if (!s.ok()) {
      handles.clear();
      if (!options.create_if_missing && s.IsInvalidArgument() &&
          s.ToString().find("does not exist") != std::string::npos) {
        return absl::NotFoundError(absl::StrCat("database ", path, " does not exist"));
      }
      return FromRocks(s, absl::StrCat("opening database ", path));
    }
    db.reset(raw);
    for (rocksdb::ColumnFamilyHandle* h : handles) {
      if (h->GetName() == rocksdb::kDefaultColumnFamilyName) {
        default_cf = h;
      } else if (wanted.contains(h->GetName())) {
        tables.emplace(h->GetName(), h);
      }
    }
    TS_CHECK(default_cf != nullptr);
    absl::Status schema = CheckSchemaLocked();
    if (!schema.ok()) CloseLocked();
    return schema;
  }

  absl::Status CheckSchemaLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    std::string stored;
    rocksdb::Status s =
        db->Get(rocksdb::ReadOptions(), default_cf, ToSlice(kSchemaVersionKey), &stored);
    if (s.IsNotFound()) {
      rocksdb::WriteOptions wo;
      wo.sync = true;
      s = db->Put(wo, default_cf, ToSlice(kSchemaVersionKey),
                  std::to_string(options.schema_version));
      return FromRocks(s, absl::StrCat("writing schema version to ", path));
    }
    TS_RETURN_IF_ERROR(FromRocks(s, absl::StrCat("reading schema version of ", path)));
    uint32_t version = 0;
    if (!absl::SimpleAtoi(stored, &version)) {
      return absl::DataLossError(
          absl::StrCat("database ", path, ": schema_version \"", stored, "\" is not a number"));
    }
    if (version != options.schema_version) {
      return absl::FailedPreconditionError(absl::StrCat("database ", path, ": schema_version ",
                                                        version, " is not the expected ",
                                                        options.schema_version));
    }
    return absl::OkStatus();
  }

  void CloseLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (db == nullptr) return;
    for (rocksdb::ColumnFamilyHandle* h : handles) db->DestroyColumnFamilyHandle(h);
    handles.clear();
    tables.clear();
    default_cf = nullptr;
    // After a write error Close reports that error again; there is nothing more to do with it.
    db->Close().PermitUncheckedError();
    db.reset();
  }

  absl::Status ClosedErrorLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu) {
    return absl::UnavailableError(
        absl::StrCat("database ", path,
                     " is closed after a write error; it opens again once the "
                     "filesystem has room"));
  }

  absl::StatusOr<rocksdb::ColumnFamilyHandle*> TableLocked(std::string_view name) const
      ABSL_SHARED_LOCKS_REQUIRED(mu) {
    auto it = tables.find(name);
    if (it == tables.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("table \"", Sv(name), "\" is not a table of the database at ", path));
    }
    return it->second;
  }

  // ---- health and recovery

  void NoteError(const absl::Status& status) {
    bool first = false;
    {
      absl::MutexLock lock(&health_mu);
      first = error.ok();
      if (first) {
        error_since_unix_ms = clock->NowUnixMs();
        error_since_ms = clock->MonotonicMs();
      }
      error = status;
    }
    if (first) {
      common::Log(common::LogLevel::kError, kComponent,
                  "database refuses writes; it recovers once the filesystem has room",
                  {{"db", path},
                   {"code", absl::StatusCodeToString(status.code())},
                   {"error", std::string(status.message())}});
    }
  }

  // Bytes of the write-ahead logs, which a reopen replays into a table file.
  uint64_t LogBytes() const {
    std::vector<rocksdb::FileAttributes> children;
    if (!fs->GetChildrenFileAttributes(path, rocksdb::IOOptions(), &children, nullptr).ok()) {
      return 0;
    }
    uint64_t bytes = 0;
    for (const rocksdb::FileAttributes& child : children) {
      if (absl::EndsWith(child.name, ".log")) bytes += child.size_bytes;
    }
    return bytes;
  }

  // When the database refuses writes and a recovery is due (at most once per
  // recovery_interval_ms) and the filesystem has room, closes the database and opens it again.
  // True if the database takes writes afterwards (recovered here or by another thread).
  bool MaybeRecover() ABSL_LOCKS_EXCLUDED(mu, health_mu) {
    absl::Status was;
    {
      absl::MutexLock lock(&health_mu);
      if (error.ok()) return true;
      const int64_t now_ms = clock->MonotonicMs();
      if (last_attempt_ms.has_value() && now_ms - *last_attempt_ms < options.recovery_interval_ms) {
        return false;
      }
      last_attempt_ms = now_ms;
      was = error;
    }
    uint64_t free_bytes = 0;
    const rocksdb::IOStatus space =
        fs->GetFreeSpace(path, rocksdb::IOOptions(), &free_bytes, nullptr);
    const uint64_t needed_bytes = LogBytes() + options.recovery_free_bytes_min;
    // A filesystem that cannot tell its free space gets the reopen tried.
    if (space.ok() && free_bytes < needed_bytes) return false;

    absl::Status opened;
    {
      absl::MutexLock lock(&mu);
      {
        absl::MutexLock health(&health_mu);
        if (error.ok()) return true;  // another writer recovered while this one waited
      }
      CloseLocked();
      opened = OpenLocked();
    }
    if (!opened.ok()) {
      NoteError(absl::UnavailableError(
          absl::StrCat("database ", path, " is closed: opening it again after \"", was.message(),
                       "\" failed: ", opened.message())));
      return false;
    }
    int64_t down_ms = 0;
    uint64_t count = 0;
    {
      absl::MutexLock lock(&health_mu);
      down_ms = clock->MonotonicMs() - error_since_ms;
      error = absl::OkStatus();
      error_since_unix_ms = 0;
      count = ++recoveries;
    }
    common::Log(common::LogLevel::kInfo, kComponent, "database reopened; it takes writes again",
                {{"db", path},
                 {"was", std::string(was.message())},
                 {"down_ms", absl::StrCat(down_ms)},
                 {"free_bytes", absl::StrCat(free_bytes)},
                 {"recoveries", absl::StrCat(count)}});
    return true;
  }

  // One attempt at writing `batch`. *io_error: the write failed in a way that leaves the
  // database refusing writes until it is recovered.
  absl::Status WriteOnce(const WriteBatch& batch, bool sync, bool* io_error) const
      ABSL_LOCKS_EXCLUDED(mu) {
    *io_error = false;
    absl::ReaderMutexLock lock(&mu);
    if (db == nullptr) {
      *io_error = true;
      return ClosedErrorLocked();
    }
    rocksdb::WriteBatch wb;
    for (const WriteBatch::Op& op : batch.ops_) {
      TS_ASSIGN_OR_RETURN(rocksdb::ColumnFamilyHandle * cf, TableLocked(op.table));
      rocksdb::Status s = op.value.has_value() ? wb.Put(cf, ToSlice(op.key), ToSlice(*op.value))
                                               : wb.Delete(cf, ToSlice(op.key));
      TS_RETURN_IF_ERROR(FromRocks(s, "building write batch"));
    }
    rocksdb::WriteOptions wo;
    wo.sync = sync;
    rocksdb::Status s = db->Write(wo, &wb);
    *io_error = NeedsRecovery(s);
    return FromRocks(s, absl::StrCat("writing batch to ", path));
  }
};

Db::Db(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Db::~Db() = default;

absl::StatusOr<std::unique_ptr<Db>> Db::Open(const std::string& path, DbOptions options) {
  std::set<std::string, std::less<>> wanted;
  for (const std::string& t : options.tables) {
    TS_RETURN_IF_ERROR(ValidateTableName(t));
    if (!wanted.insert(t).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("options.tables: table \"", t, "\" is named twice"));
    }
  }
  auto impl = std::make_unique<Impl>(path, std::move(options));
  {
    absl::MutexLock lock(&impl->mu);
    TS_RETURN_IF_ERROR(impl->OpenLocked());
  }
  return std::unique_ptr<Db>(new Db(std::move(impl)));
}

absl::StatusOr<std::string> Db::Get(std::string_view table, std::string_view key) const {
  absl::ReaderMutexLock lock(&impl_->mu);
  if (impl_->db == nullptr) return impl_->ClosedErrorLocked();
  TS_ASSIGN_OR_RETURN(rocksdb::ColumnFamilyHandle * cf, impl_->TableLocked(table));
  std::string value;
  rocksdb::Status s = impl_->db->Get(rocksdb::ReadOptions(), cf, ToSlice(key), &value);
  if (s.IsNotFound()) {
    return absl::NotFoundError(
        absl::StrCat("table ", Sv(table), ": key of ", key.size(), " bytes is absent"));
  }
  TS_RETURN_IF_ERROR(FromRocks(s, absl::StrCat("reading table ", Sv(table))));
  return value;
}

absl::Status Db::GetProto(std::string_view table, std::string_view key,
                          google::protobuf::MessageLite* value) const {
  TS_ASSIGN_OR_RETURN(std::string bytes, Get(table, key));
  if (!value->ParseFromString(bytes)) {
    return absl::DataLossError(absl::StrCat("table ", Sv(table), ": stored value (", bytes.size(),
                                            " bytes) does not parse as ", value->GetTypeName()));
  }
  return absl::OkStatus();
}

absl::Status Db::Write(const WriteBatch& batch, bool sync) {
  impl_->MaybeRecover();
  bool io_error = false;
  absl::Status status = impl_->WriteOnce(batch, sync, &io_error);
  if (!io_error) return status;
  impl_->NoteError(status);
  // A write error is what starts a recovery: the first attempt comes at once.
  if (!impl_->MaybeRecover()) return status;
  status = impl_->WriteOnce(batch, sync, &io_error);
  if (io_error) impl_->NoteError(status);
  return status;
}

absl::Status Db::Scan(
    std::string_view table, std::string_view prefix,
    const std::function<bool(std::string_view key, std::string_view value)>& fn) const {
  return ScanFrom(table, prefix, prefix, fn);
}

absl::Status Db::ScanFrom(std::string_view table, std::string_view prefix, std::string_view start,
                          const std::function<bool(std::string_view, std::string_view)>& fn) const {
  absl::ReaderMutexLock lock(&impl_->mu);
  if (impl_->db == nullptr) return impl_->ClosedErrorLocked();
  TS_ASSIGN_OR_RETURN(rocksdb::ColumnFamilyHandle * cf, impl_->TableLocked(table));
  // Start no earlier than the prefix itself; a start past every prefixed key yields nothing.
  std::string_view seek = std::max(start, prefix);
  const std::string upper = PrefixSuccessor(prefix);
  rocksdb::Slice upper_slice(upper);
  rocksdb::ReadOptions ro;
  if (!upper.empty()) ro.iterate_upper_bound = &upper_slice;
  std::unique_ptr<rocksdb::Iterator> it(impl_->db->NewIterator(ro, cf));
  for (it->Seek(ToSlice(seek)); it->Valid(); it->Next()) {
    std::string_view key = ToView(it->key());
    // The upper bound already stops at the prefix's end; the check guards the unbounded case.
    if (key.substr(0, prefix.size()) != prefix) break;
    if (!fn(key, ToView(it->value()))) break;
  }
  return FromRocks(it->status(), absl::StrCat("scanning table ", Sv(table)));
}

const std::string& Db::path() const { return impl_->path; }

DbHealth Db::Health() const {
  absl::MutexLock lock(&impl_->health_mu);
  DbHealth health;
  health.error = impl_->error;
  health.since_unix_ms = impl_->error_since_unix_ms;
  health.recoveries = impl_->recoveries;
  return health;
}

std::string EncodeU64Key(uint64_t v) {
  std::string out(8, '\0');
  for (int i = 7; i >= 0; --i) {
    out[i] = static_cast<char>(v & 0xff);
    v >>= 8;
  }
  return out;
}

uint64_t DecodeU64Key(std::string_view key) {
  TS_CHECK(key.size() >= 8);
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = (v << 8) | static_cast<unsigned char>(key[i]);
  return v;
}

}  // namespace ts::state
