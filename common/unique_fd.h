// UniqueFd: an owned file descriptor, closed on destruction or Reset; movable, not copyable.
// Shared by every module that works with raw sockets and files (the collective's transport, the
// artifact store's safe directories, the ABCI server). Not thread-safe (an owner, not a lock).
#ifndef TS_COMMON_UNIQUE_FD_H_
#define TS_COMMON_UNIQUE_FD_H_

#include <unistd.h>

#include <utility>

namespace ts::common {

class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    if (this != &other) {
      Reset();
      fd_ = other.release();
    }
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { Reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  // Gives up ownership: the caller closes the descriptor.
  int release() { return std::exchange(fd_, -1); }
  void Reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

}  // namespace ts::common

#endif  // TS_COMMON_UNIQUE_FD_H_
