#include "sidecar/collective/gloo_collective.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <exception>
#include <filesystem>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gloo/allgather.h"
#include "gloo/allreduce.h"
#include "gloo/common/error.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/file_store.h"
#include "gloo/rendezvous/prefix_store.h"
#include "gloo/rendezvous/store.h"
#include "gloo/transport/device.h"
#include "gloo/transport/tcp/attr.h"
#include "gloo/transport/tcp/device.h"

namespace ts::sidecar {
namespace {

// Gloo's FileStore::get waits for its key with Gloo's fixed 30 s default, whatever the caller's
// timeout; this store makes every wait (get included) honour `timeout`.
class TimeoutStore : public gloo::rendezvous::Store {
 public:
  TimeoutStore(gloo::rendezvous::Store& inner, std::chrono::milliseconds timeout)
      : inner_(inner), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    inner_.set(key, data);
  }
  std::vector<char> get(const std::string& key) override {
    inner_.wait({key}, timeout_);
    return inner_.get(key);
  }
  void wait(const std::vector<std::string>& keys) override { inner_.wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    inner_.wait(keys, timeout);
  }

 private:
  gloo::rendezvous::Store& inner_;
  const std::chrono::milliseconds timeout_;
};

// Element-wise c = a + b in index order (Gloo's own gloo::sum<T> compares int with size_t).
void SumFloats(void* c, const void* a, const void* b, size_t n) {
  float* out = static_cast<float*>(c);
  const float* x = static_cast<const float*>(a);
  const float* y = static_cast<const float*>(b);
  for (size_t i = 0; i < n; ++i) out[i] = x[i] + y[i];
}

// Gloo's device lookup (getaddrinfo, then bind) reads an uninitialized list when getaddrinfo
// fails and leaks the list when no address binds; checking here first keeps it off those paths.
absl::Status CheckBindIp(const std::string& ip) {
  sockaddr_storage addr{};
  socklen_t len = 0;
  auto* v4 = reinterpret_cast<sockaddr_in*>(&addr);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&addr);
  if (inet_pton(AF_INET, ip.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    len = sizeof(sockaddr_in);
  } else if (inet_pton(AF_INET6, ip.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    len = sizeof(sockaddr_in6);
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("gloo options: bind_ip \"", ip, "\" is not an IPv4 or IPv6 address"));
  }
  const int fd = socket(addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat("gloo bind_ip ", ip, ": socket: ", strerror(errno)));
  }
  const int rv = bind(fd, reinterpret_cast<const sockaddr*>(&addr), len);
  const int bind_errno = errno;
  close(fd);
  if (rv != 0) {
    return absl::UnavailableError(
        absl::StrCat("gloo bind_ip ", ip, ": bind: ", strerror(bind_errno)));
  }
  return absl::OkStatus();
}

absl::Status GlooFailure(const std::string& what, const std::exception& e) {
  return absl::UnavailableError(absl::StrCat("gloo ", what, ": ", e.what()));
}

}  // namespace

struct GlooCollective::Impl {
  std::shared_ptr<gloo::transport::Device> device;
  std::shared_ptr<gloo::rendezvous::Context> context;
  int rank = 0;
  int size = 0;
  // Operations run one at a time, in the same order on every member, so a counter gives each
  // its own Gloo slot on every member.
  uint32_t next_tag = 0;
};

absl::StatusOr<std::unique_ptr<GlooCollective>> GlooCollective::Connect(
    const GlooOptions& options) {
  if (options.size < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("gloo options: size ", options.size, " is below 2"));
  }
  if (options.rank < 0 || options.rank >= options.size) {
    return absl::InvalidArgumentError(
        absl::StrCat("gloo options: rank ", options.rank, " is outside [0, ", options.size, ")"));
  }
  if (options.store_dir.empty()) {
    return absl::InvalidArgumentError("gloo options: store_dir is empty");
  }
  if (options.timeout_ms <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("gloo options: timeout_ms ", options.timeout_ms, " is not positive"));
  }
  if (absl::Status s = CheckBindIp(options.bind_ip); !s.ok()) return s;
  std::error_code ec;
  std::filesystem::create_directories(options.store_dir, ec);
  if (ec) {
    return absl::UnavailableError(
        absl::StrCat("gloo store_dir ", options.store_dir, ": cannot create: ", ec.message()));
  }

  auto impl = std::make_unique<Impl>();
  impl->rank = options.rank;
  impl->size = options.size;
  const std::chrono::milliseconds timeout(options.timeout_ms);
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = options.bind_ip;
    impl->device = gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    return GlooFailure(absl::StrCat("device on bind_ip ", options.bind_ip), e);
  }
  try {
    gloo::rendezvous::FileStore file_store(options.store_dir);
    gloo::rendezvous::PrefixStore prefix_store(options.prefix, file_store);
    TimeoutStore store(prefix_store, timeout);
    auto context = std::make_shared<gloo::rendezvous::Context>(options.rank, options.size);
    context->setTimeout(timeout);
    context->connectFullMesh(store, impl->device);
    impl->context = std::move(context);
  } catch (const std::exception& e) {
    return GlooFailure(
        absl::StrCat("rendezvous in ", options.store_dir, " (prefix \"", options.prefix,
                     "\", rank ", options.rank, " of ", options.size, ")"),
        e);
  }
  return std::unique_ptr<GlooCollective>(new GlooCollective(std::move(impl)));
}

GlooCollective::GlooCollective(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

GlooCollective::~GlooCollective() = default;

absl::Status GlooCollective::AllReduce(std::span<float> data, bool mean) {
  if (data.empty()) return absl::OkStatus();
  try {
    gloo::AllreduceOptions opts(impl_->context);
    opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
    opts.setOutput(data.data(), data.size());
    opts.setReduceFunction(&SumFloats);
    opts.setTag(impl_->next_tag++);
    gloo::allreduce(opts);
  } catch (const std::exception& e) {
    return GlooFailure(absl::StrCat("allreduce of ", data.size(), " floats"), e);
  }
  if (mean) {
    const float count = static_cast<float>(impl_->size);
    for (float& x : data) x /= count;
  }
  return absl::OkStatus();
}

absl::Status GlooCollective::AllGather(std::span<const float> mine, std::span<float> out) {
  const size_t want = mine.size() * static_cast<size_t>(impl_->size);
  if (out.size() != want) {
    return absl::InvalidArgumentError(absl::StrCat("gloo allgather: out has ", out.size(),
                                                   " floats, want ", mine.size(), " x ",
                                                   impl_->size, " = ", want));
  }
  if (mine.empty()) return absl::OkStatus();
  try {
    gloo::AllgatherOptions opts(impl_->context);
    // Gloo only reads the input buffer; its API takes a mutable pointer.
    opts.setInput(const_cast<float*>(mine.data()), mine.size());
    opts.setOutput(out.data(), out.size());
    opts.setTag(impl_->next_tag++);
    gloo::allgather(opts);
  } catch (const std::exception& e) {
    return GlooFailure(absl::StrCat("allgather of ", mine.size(), " floats per member"), e);
  }
  return absl::OkStatus();
}

}  // namespace ts::sidecar
