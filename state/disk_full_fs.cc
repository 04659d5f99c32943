#include "state/disk_full_fs.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

namespace ts::state {
namespace {

rocksdb::IOStatus InjectedNoSpace(const std::string& name) {
  return rocksdb::IOStatus::NoSpace(absl::StrCat("While writing ", name),
                                    "No space left on device (injected)");
}

class DiskFullFile final : public rocksdb::FSWritableFileOwnerWrapper {
 public:
  DiskFullFile(std::unique_ptr<rocksdb::FSWritableFile> file, std::string name,
               std::shared_ptr<DiskFullFault> fault)
      : rocksdb::FSWritableFileOwnerWrapper(std::move(file)),
        name_(std::move(name)),
        fault_(std::move(fault)) {}

  rocksdb::IOStatus Append(const rocksdb::Slice& data, const rocksdb::IOOptions& options,
                           rocksdb::IODebugContext* dbg) override {
    if (fault_->full()) return InjectedNoSpace(name_);
    return FSWritableFileOwnerWrapper::Append(data, options, dbg);
  }
  rocksdb::IOStatus Append(const rocksdb::Slice& data, const rocksdb::IOOptions& options,
                           const rocksdb::DataVerificationInfo& info,
                           rocksdb::IODebugContext* dbg) override {
    if (fault_->full()) return InjectedNoSpace(name_);
    return FSWritableFileOwnerWrapper::Append(data, options, info, dbg);
  }
  rocksdb::IOStatus PositionedAppend(const rocksdb::Slice& data, uint64_t offset,
                                     const rocksdb::IOOptions& options,
                                     rocksdb::IODebugContext* dbg) override {
    if (fault_->full()) return InjectedNoSpace(name_);
    return FSWritableFileOwnerWrapper::PositionedAppend(data, offset, options, dbg);
  }
  rocksdb::IOStatus PositionedAppend(const rocksdb::Slice& data, uint64_t offset,
                                     const rocksdb::IOOptions& options,
                                     const rocksdb::DataVerificationInfo& info,
                                     rocksdb::IODebugContext* dbg) override {
    if (fault_->full()) return InjectedNoSpace(name_);
    return FSWritableFileOwnerWrapper::PositionedAppend(data, offset, options, info, dbg);
  }
  rocksdb::IOStatus Flush(const rocksdb::IOOptions& options,
                          rocksdb::IODebugContext* dbg) override {
    if (fault_->full()) return InjectedNoSpace(name_);
    return FSWritableFileOwnerWrapper::Flush(options, dbg);
  }
  rocksdb::IOStatus Sync(const rocksdb::IOOptions& options, rocksdb::IODebugContext* dbg) override {
    if (fault_->full()) return InjectedNoSpace(name_);
    return FSWritableFileOwnerWrapper::Sync(options, dbg);
  }
  rocksdb::IOStatus Fsync(const rocksdb::IOOptions& options,
                          rocksdb::IODebugContext* dbg) override {
    if (fault_->full()) return InjectedNoSpace(name_);
    return FSWritableFileOwnerWrapper::Fsync(options, dbg);
  }

 private:
  const std::string name_;
  const std::shared_ptr<DiskFullFault> fault_;
};

class DiskFullFileSystem final : public rocksdb::FileSystemWrapper {
 public:
  explicit DiskFullFileSystem(std::shared_ptr<DiskFullFault> fault)
      : rocksdb::FileSystemWrapper(rocksdb::FileSystem::Default()), fault_(std::move(fault)) {}

  const char* Name() const override { return "DiskFullFileSystem"; }

  rocksdb::IOStatus NewWritableFile(const std::string& name, const rocksdb::FileOptions& options,
                                    std::unique_ptr<rocksdb::FSWritableFile>* result,
                                    rocksdb::IODebugContext* dbg) override {
    if (fault_->full()) return InjectedNoSpace(name);
    std::unique_ptr<rocksdb::FSWritableFile> file;
    rocksdb::IOStatus s = target()->NewWritableFile(name, options, &file, dbg);
    if (s.ok()) *result = std::make_unique<DiskFullFile>(std::move(file), name, fault_);
    return s;
  }
  rocksdb::IOStatus ReopenWritableFile(const std::string& name, const rocksdb::FileOptions& options,
                                       std::unique_ptr<rocksdb::FSWritableFile>* result,
                                       rocksdb::IODebugContext* dbg) override {
    if (fault_->full()) return InjectedNoSpace(name);
    std::unique_ptr<rocksdb::FSWritableFile> file;
    rocksdb::IOStatus s = target()->ReopenWritableFile(name, options, &file, dbg);
    if (s.ok()) *result = std::make_unique<DiskFullFile>(std::move(file), name, fault_);
    return s;
  }
  rocksdb::IOStatus ReuseWritableFile(const std::string& name, const std::string& old_name,
                                      const rocksdb::FileOptions& options,
                                      std::unique_ptr<rocksdb::FSWritableFile>* result,
                                      rocksdb::IODebugContext* dbg) override {
    if (fault_->full()) return InjectedNoSpace(name);
    std::unique_ptr<rocksdb::FSWritableFile> file;
    rocksdb::IOStatus s = target()->ReuseWritableFile(name, old_name, options, &file, dbg);
    if (s.ok()) *result = std::make_unique<DiskFullFile>(std::move(file), name, fault_);
    return s;
  }
  rocksdb::IOStatus GetFreeSpace(const std::string& path, const rocksdb::IOOptions& options,
                                 uint64_t* free_bytes, rocksdb::IODebugContext* dbg) override {
    if (fault_->full()) {
      *free_bytes = 0;
      return rocksdb::IOStatus::OK();
    }
    return target()->GetFreeSpace(path, options, free_bytes, dbg);
  }

 private:
  const std::shared_ptr<DiskFullFault> fault_;
};

}  // namespace

std::shared_ptr<rocksdb::FileSystem> NewDiskFullFileSystem(std::shared_ptr<DiskFullFault> fault) {
  return std::make_shared<DiskFullFileSystem>(std::move(fault));
}

}  // namespace ts::state
