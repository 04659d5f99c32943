#include "tests/sim/sim_world.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/crypto/hash.h"
#include "common/status.h"
#include "sidecar/shard/ledger.h"

namespace ts::sim {
namespace {

using sidecar::PeerFailure;

}  // namespace

// ---- the network

SimHostState* SimNet::Host(const std::string& address) {
  auto it = hosts_.find(address);
  return it == hosts_.end() ? nullptr : &it->second;
}

SimHostState* SimNet::ByEndpoint(const std::string& endpoint) {
  const size_t colon = endpoint.find(':');
  return colon == std::string::npos ? nullptr : Host(endpoint.substr(colon + 1));
}

bool SimNet::Reachable(const std::string& a, const std::string& b) const {
  return !cuts_.contains(Cut(a, b));
}

int64_t SimNet::Delay() {
  const int64_t base = rng_.Between(1, 20);
  return scheduler_.now() < slow_until_ms_ ? base * 50 : base;
}

std::shared_ptr<SimMeshGroup> SimNet::Group(const sidecar::GroupSpec& group, size_t self) {
  const std::string id = sidecar::MeshIdOf(group);
  auto& slot = meshes_[id];
  if (slot == nullptr || !slot->failure.ok() || slot->connected[self]) {
    slot = std::make_shared<SimMeshGroup>();
    slot->group = group;
    slot->connected.assign(group.members.size(), false);
  }
  return slot;
}

void SimNet::FailMeshesOf(const std::string& address, const std::string& why) {
  for (auto& [id, g] : meshes_) {
    for (const auto& m : g->group.members) {
      if (m.address == address) g->Fail(PeerFailure(absl::StatusCode::kUnavailable, address, why));
    }
  }
}

namespace {

// ---- ShardRound between the hosts' runs

class SimPeers final : public sidecar::RoundPeers {
 public:
  SimPeers(SimNet* net, std::string self) : net_(*net), self_(std::move(self)) {}

  absl::StatusOr<pb::AnnounceResponse> Announce(const std::string& endpoint,
                                                const pb::AnnounceRequest& request,
                                                int64_t timeout_ms) override {
    TS_ASSIGN_OR_RETURN(SimHostState * to, Reach(endpoint, timeout_ms));
    pb::AnnounceResponse response = to->run->OnAnnounce(self_, request);
    if (net_.Duplicate()) response = to->run->OnAnnounce(self_, request);
    if (to->lies && response.has_plan()) Lie(*to, response.mutable_plan());
    return Back(to, std::move(response), timeout_ms);
  }

  absl::StatusOr<pb::GetCertificatesResponse> GetCertificates(
      const std::string& endpoint, const pb::GetCertificatesRequest& request,
      int64_t timeout_ms) override {
    TS_ASSIGN_OR_RETURN(SimHostState * to, Reach(endpoint, timeout_ms));
    TS_ASSIGN_OR_RETURN(pb::GetCertificatesResponse response, to->run->OnGetCertificates(request));
    return Back(to, std::move(response), timeout_ms);
  }

  std::jthread AnnounceInBackground(std::vector<std::pair<std::string, pb::AnnounceRequest>> sends,
                                    int64_t timeout_ms) override {
    // Sent now, on the run's thread: the simulation schedules no thread it did not start.
    for (const auto& [endpoint, request] : sends) (void)Announce(endpoint, request, timeout_ms);
    return {};
  }

 private:
  // The call's way there: the target when it is up and reachable after the delay.
  absl::StatusOr<SimHostState*> Reach(const std::string& endpoint, int64_t timeout_ms) {
    SimScheduler& s = net_.scheduler();
    SimHostState* to = net_.ByEndpoint(endpoint);
    const int64_t delay = net_.Delay();
    if (net_.Host(self_)->run == nullptr) return absl::UnavailableError("sim: this host is down");
    if (to == nullptr || net_.Drop()) {
      s.Sleep(timeout_ms);
      return absl::DeadlineExceededError(absl::StrCat("sim: ", endpoint, " did not answer"));
    }
    s.Sleep(std::min(delay, timeout_ms));
    if (to->run == nullptr || !net_.Reachable(self_, to->address)) {
      return absl::UnavailableError(absl::StrCat("sim: ", endpoint, " unreachable"));
    }
    return to;
  }
  // The answer's way back.
  template <typename Response>
  absl::StatusOr<Response> Back(SimHostState* from, Response response, int64_t timeout_ms) {
    net_.scheduler().Sleep(std::min(net_.Delay(), timeout_ms));
    if (!net_.Reachable(self_, from->address)) {
      return absl::UnavailableError(absl::StrCat("sim: ", from->address, " unreachable"));
    }
    return response;
  }
  // A planner that lies: its plan moves the round to a base of its own, signed by itself.
  static void Lie(const SimHostState& liar, pb::RoundPlan* plan) {
    plan->set_base_root(common::Sha256(absl::StrCat("lie:", plan->base_root())));
    (void)sidecar::SignPlan(*liar.key, "sim-chain", plan);
  }

  SimNet& net_;
  const std::string self_;
};

// ---- the collective's mesh

class SimLink final : public sidecar::Link {
 public:
  SimLink(SimNet* net, std::shared_ptr<SimMeshGroup> g, size_t self, size_t peer)
      : net_(*net),
        g_(std::move(g)),
        self_(self),
        peer_(peer),
        address_(g_->group.members[peer].address) {}

  const std::string& peer() const override { return address_; }
  absl::Status Send(const sidecar::FrameHeader& header, std::string_view payload,
                    int64_t deadline_ms) override {
    if (!g_->failure.ok()) return g_->failure;
    if (!Up()) return g_->failure;
    auto& q = g_->queues[{self_, peer_}];
    int64_t at = net_.scheduler().now() + net_.Delay();
    if (!q.empty()) at = std::max(at, q.back().deliver_at);
    sidecar::FrameHeader h = header;
    h.payload_size = static_cast<uint32_t>(payload.size());
    q.push_back({.frame = {.header = h, .payload = std::string(payload)}, .deliver_at = at});
    sent_ += payload.size() + 32;
    return absl::OkStatus();
  }
  absl::StatusOr<sidecar::Frame> Recv(int64_t deadline_ms) override {
    SimScheduler& s = net_.scheduler();
    while (true) {
      if (!g_->failure.ok()) return g_->failure;
      if (!Up()) return g_->failure;
      auto& q = g_->queues[{peer_, self_}];
      const int64_t now = s.now();
      if (!q.empty() && q.front().deliver_at <= now) {
        sidecar::Frame f = std::move(q.front().frame);
        q.pop_front();
        received_ += f.payload.size() + 32;
        return f;
      }
      if (now >= deadline_ms) {
        return PeerFailure(absl::StatusCode::kDeadlineExceeded, address_, "sim: nothing received");
      }
      const int64_t next = q.empty() ? now + 5 : std::min(now + 5, q.front().deliver_at);
      s.Sleep(std::max<int64_t>(1, std::min(next, deadline_ms) - now));
    }
  }
  void Recycle(std::string) override {}
  bool SendNeverBlocks() const override { return true; }
  uint64_t bytes_sent() const override { return sent_; }
  uint64_t bytes_received() const override { return received_; }

 private:
  // Whether the peer is up and reachable; fails the mesh naming it when not.
  bool Up() {
    SimHostState* peer = net_.Host(address_);
    SimHostState* me = net_.Host(g_->group.members[self_].address);
    if (me->run == nullptr) {
      g_->Fail(PeerFailure(absl::StatusCode::kUnavailable, me->address, "sim: this host is down"));
      return false;
    }
    if (peer == nullptr || peer->run == nullptr || !net_.Reachable(me->address, address_)) {
      g_->Fail(PeerFailure(absl::StatusCode::kUnavailable, address_, "sim: connection reset"));
      return false;
    }
    return true;
  }

  SimNet& net_;
  std::shared_ptr<SimMeshGroup> g_;
  const size_t self_, peer_;
  const std::string address_;
  uint64_t sent_ = 0, received_ = 0;
};

class SimMesh final : public sidecar::Mesh {
 public:
  SimMesh(SimNet* net, std::shared_ptr<SimMeshGroup> g, size_t self)
      : g_(std::move(g)), self_(self) {
    for (size_t i = 0; i < g_->group.members.size(); ++i) {
      links_.push_back(i == self ? nullptr : std::make_unique<SimLink>(net, g_, self, i));
    }
  }
  const sidecar::GroupSpec& group() const override { return g_->group; }
  size_t self_index() const override { return self_; }
  sidecar::Link* link(size_t member_index) override { return links_[member_index].get(); }
  absl::Status failure() const override { return g_->failure; }
  void Abort(const absl::Status& status) override { g_->Fail(status); }

 private:
  std::shared_ptr<SimMeshGroup> g_;
  const size_t self_;
  std::vector<std::unique_ptr<SimLink>> links_;
};

class SimTransport final : public sidecar::Transport {
 public:
  SimTransport(SimNet* net, std::string self) : net_(*net), self_(std::move(self)) {}

  absl::StatusOr<std::unique_ptr<sidecar::Mesh>> Connect(const sidecar::GroupSpec& group,
                                                         size_t self_index,
                                                         int64_t deadline_ms) override {
    TS_RETURN_IF_ERROR(sidecar::ValidateGroup(group));
    if (self_index >= group.members.size() || group.members[self_index].address != self_) {
      return absl::InvalidArgumentError("sim: self_index is not this host");
    }
    std::shared_ptr<SimMeshGroup> g = net_.Group(group, self_index);
    g->connected[self_index] = true;
    SimScheduler& s = net_.scheduler();
    while (true) {
      if (!stopped_.ok()) {
        g->Fail(stopped_);
        return stopped_;
      }
      if (!g->failure.ok()) return g->failure;
      bool all = true;
      for (size_t i = 0; i < group.members.size(); ++i) {
        const std::string& a = group.members[i].address;
        SimHostState* peer = net_.Host(a);
        if (i != self_index &&
            (peer == nullptr || peer->run == nullptr || !net_.Reachable(self_, a))) {
          g->Fail(PeerFailure(absl::StatusCode::kUnavailable, a, "sim: connection refused"));
          return g->failure;
        }
        all = all && g->connected[i];
      }
      if (all) return std::make_unique<SimMesh>(&net_, g, self_index);
      if (s.now() >= deadline_ms) {
        return absl::DeadlineExceededError("sim: not every member connected in time");
      }
      s.Sleep(5);
    }
  }
  void StopConnecting(const absl::Status& status) override {
    if (stopped_.ok()) stopped_ = status;
  }

 private:
  SimNet& net_;
  const std::string self_;
  absl::Status stopped_;
};

}  // namespace

std::unique_ptr<sidecar::RoundPeers> MakeSimPeers(SimNet* net, const std::string& self) {
  return std::make_unique<SimPeers>(net, self);
}

sidecar::StartedTransport MakeSimTransport(SimNet* net, const std::string& self) {
  return {.transport = std::make_unique<SimTransport>(net, self),
          .endpoint = SimNet::MeshEndpoint(self)};
}

}  // namespace ts::sim
