// The file system behind a DiskFullFault (state/db.h): RocksDB's default one, except that while
// the fault is set every file creation and write fails with "No space left on device" and the
// free space reads 0, as on a full disk. For tests; internal to state/.
//
// Thread-safety: thread-safe (the fault is an atomic switch).
#ifndef TS_STATE_DISK_FULL_FS_H_
#define TS_STATE_DISK_FULL_FS_H_

#include <memory>

#include "rocksdb/file_system.h"
#include "state/db.h"

namespace ts::state {

std::shared_ptr<rocksdb::FileSystem> NewDiskFullFileSystem(std::shared_ptr<DiskFullFault> fault);

}  // namespace ts::state

#endif  // TS_STATE_DISK_FULL_FS_H_
