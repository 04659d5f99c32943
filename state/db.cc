#include "state/db.h"

#include <algorithm>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "rocksdb/db.h"
#include "rocksdb/options.h"
#include "rocksdb/slice.h"
#include "rocksdb/write_batch.h"

namespace ts::state {
namespace {

constexpr std::string_view kSchemaVersionKey = "schema_version";
constexpr size_t kTableNameMax = 64;

rocksdb::Slice ToSlice(std::string_view s) { return rocksdb::Slice(s.data(), s.size()); }
std::string_view ToView(const rocksdb::Slice& s) { return std::string_view(s.data(), s.size()); }
// Debian's Abseil is built with its own string_view, which StrCat needs.
absl::string_view Sv(std::string_view s) { return absl::string_view(s.data(), s.size()); }

absl::Status FromRocks(const rocksdb::Status& s, std::string_view what) {
  if (s.ok()) return absl::OkStatus();
  std::string message = absl::StrCat(Sv(what), ": ", s.ToString());
  if (s.IsNotFound()) return absl::NotFoundError(message);
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
  std::string path;
  std::unique_ptr<rocksdb::DB> db;
  // Every open handle (RocksDB requires opening all existing column families); only the ones
  // named in DbOptions::tables are reachable through `tables`.
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  std::map<std::string, rocksdb::ColumnFamilyHandle*, std::less<>> tables;
  rocksdb::ColumnFamilyHandle* default_cf = nullptr;

  ~Impl() {
    if (db != nullptr) {
      for (rocksdb::ColumnFamilyHandle* h : handles) db->DestroyColumnFamilyHandle(h);
      handles.clear();
      db->Close().PermitUncheckedError();
    }
  }

  absl::StatusOr<rocksdb::ColumnFamilyHandle*> Table(std::string_view name) const {
    auto it = tables.find(name);
    if (it == tables.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("table \"", Sv(name), "\" is not a table of the database at ", path));
    }
    return it->second;
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

  rocksdb::Options db_options;
  db_options.create_if_missing = options.create_if_missing;
  db_options.create_missing_column_families = true;
  // Keep open files bounded; the databases here are small and many processes share a host.
  db_options.max_open_files = 512;
  db_options.paranoid_checks = true;

  // RocksDB must open every column family already in the database.
  std::vector<std::string> existing;
  rocksdb::Status list = rocksdb::DB::ListColumnFamilies(db_options, path, &existing);
  if (!list.ok()) existing.clear();  // a new database: nothing to list yet
  std::set<std::string, std::less<>> all(wanted.begin(), wanted.end());
  all.insert(existing.begin(), existing.end());
  all.insert(rocksdb::kDefaultColumnFamilyName);

  std::vector<rocksdb::ColumnFamilyDescriptor> descriptors;
  for (const std::string& name : all) {
    descriptors.emplace_back(name, rocksdb::ColumnFamilyOptions(db_options));
  }

  auto impl = std::make_unique<Impl>();
  impl->path = path;
  rocksdb::DB* raw = nullptr;
  rocksdb::Status s = rocksdb::DB::Open(db_options, path, descriptors, &impl->handles, &raw);
  if (!s.ok()) {
    if (!options.create_if_missing && s.IsInvalidArgument() &&
        s.ToString().find("does not exist") != std::string::npos) {
      return absl::NotFoundError(absl::StrCat("database ", path, " does not exist"));
    }
    return FromRocks(s, absl::StrCat("opening database ", path));
  }
  impl->db.reset(raw);
  for (rocksdb::ColumnFamilyHandle* h : impl->handles) {
    if (h->GetName() == rocksdb::kDefaultColumnFamilyName) {
      impl->default_cf = h;
    } else if (wanted.contains(h->GetName())) {
      impl->tables.emplace(h->GetName(), h);
    }
  }
  TS_CHECK(impl->default_cf != nullptr);

  std::string stored;
  s = impl->db->Get(rocksdb::ReadOptions(), impl->default_cf, ToSlice(kSchemaVersionKey), &stored);
  if (s.IsNotFound()) {
    rocksdb::WriteOptions wo;
    wo.sync = true;
    s = impl->db->Put(wo, impl->default_cf, ToSlice(kSchemaVersionKey),
                      std::to_string(options.schema_version));
    TS_RETURN_IF_ERROR(FromRocks(s, absl::StrCat("writing schema version to ", path)));
  } else {
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
  }
  return std::unique_ptr<Db>(new Db(std::move(impl)));
}

absl::StatusOr<std::string> Db::Get(std::string_view table, std::string_view key) const {
  TS_ASSIGN_OR_RETURN(rocksdb::ColumnFamilyHandle * cf, impl_->Table(table));
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
  rocksdb::WriteBatch wb;
  for (const WriteBatch::Op& op : batch.ops_) {
    TS_ASSIGN_OR_RETURN(rocksdb::ColumnFamilyHandle * cf, impl_->Table(op.table));
    rocksdb::Status s = op.value.has_value() ? wb.Put(cf, ToSlice(op.key), ToSlice(*op.value))
                                             : wb.Delete(cf, ToSlice(op.key));
    TS_RETURN_IF_ERROR(FromRocks(s, "building write batch"));
  }
  rocksdb::WriteOptions wo;
  wo.sync = sync;
  return FromRocks(impl_->db->Write(wo, &wb), absl::StrCat("writing batch to ", impl_->path));
}

absl::Status Db::Scan(
    std::string_view table, std::string_view prefix,
    const std::function<bool(std::string_view key, std::string_view value)>& fn) const {
  return ScanFrom(table, prefix, prefix, fn);
}

absl::Status Db::ScanFrom(std::string_view table, std::string_view prefix, std::string_view start,
                          const std::function<bool(std::string_view, std::string_view)>& fn) const {
  TS_ASSIGN_OR_RETURN(rocksdb::ColumnFamilyHandle * cf, impl_->Table(table));
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
