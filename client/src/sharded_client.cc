#include "pagoda/client/sharded_client.h"

#include <algorithm>
#include <future>
#include <optional>
#include <random>

#include <fmt/format.h>

namespace pagoda::client {

uint64_t HashRing::hash(std::string_view text) {
  uint64_t h = 0xCBF29CE484222325ull;  // FNV-1a
  for (unsigned char c : text) h = (h ^ c) * 0x100000001B3ull;
  h = (h ^ (h >> 30)) * 0xBF58476D1CE4E5B9ull;  // splitmix64's finaliser
  h = (h ^ (h >> 27)) * 0x94D049BB133111EBull;
  return h ^ (h >> 31);
}

HashRing::HashRing(const std::vector<std::string>& endpoints, int vnodes) {
  for (const std::string& e : endpoints) {
    for (int i = 0; i < vnodes; ++i) points_.emplace_back(hash(fmt::format("{}#{}", e, i)), e);
  }
  std::sort(points_.begin(), points_.end());
}

std::vector<std::string> HashRing::owners(std::string_view key, size_t n) const {
  std::vector<std::string> found;
  if (points_.empty()) return found;
  const uint64_t h = hash(key);
  // Python's bisect.bisect: the first point strictly after the key's hash.
  auto it = std::upper_bound(points_.begin(), points_.end(), h,
                             [](uint64_t value, const auto& point) { return value < point.first; });
  size_t start = static_cast<size_t>(it - points_.begin());
  for (size_t i = 0; i < points_.size() && found.size() < n; ++i) {
    const std::string& e = points_[(start + i) % points_.size()].second;
    if (std::find(found.begin(), found.end(), e) == found.end()) found.push_back(e);
  }
  return found;
}

Result<std::unique_ptr<ShardedClient>> ShardedClient::connect(const std::vector<std::string>& endpoints,
                                                              ClientOptions options) {
  if (endpoints.empty()) return invalid_argument("endpoints: expected at least one, received none");
  std::unique_ptr<ShardedClient> s(new ShardedClient(endpoints));
  s->endpoints_ = endpoints;
  for (const std::string& e : endpoints) s->clients_[e] = Client::connect(e, options);
  return s;
}

Client& ShardedClient::client(const std::string& endpoint) { return *clients_.at(endpoint); }

Error ShardedClient::on(const std::string& endpoint, const Error& e) const {
  return Error(e.code(), fmt::format("{}: {}", endpoint, e.message()), e.method());
}

Result<ServerConfig> ShardedClient::config() {
  auto c = clients_.at(endpoints_.front())->config();
  if (!c.ok()) return on(endpoints_.front(), c.error());
  return c;
}

Result<SequenceRef> ShardedClient::create_sequence(const std::string& label, const std::string& placement_key) {
  std::string key = !placement_key.empty() ? placement_key : label;
  if (key.empty()) key = fmt::format("{:016x}", std::random_device{}() * 0x100000000ull + std::random_device{}());
  const std::string endpoint = ring_.owners(key).front();
  auto id = clients_.at(endpoint)->create_sequence(label);
  if (!id.ok()) return on(endpoint, id.error());
  return SequenceRef{endpoint, *id};
}

Result<int32_t> ShardedClient::append_kv(const SequenceRef& ref, int32_t layer, std::span<const float> k,
                                         std::span<const float> v) {
  auto it = clients_.find(ref.endpoint);
  if (it == clients_.end()) return invalid_argument(fmt::format("endpoint: expected one of the pods, received '{}'", ref.endpoint));
  auto r = it->second->append_kv(ref.sequence_id, layer, k, v);
  if (!r.ok()) return on(ref.endpoint, r.error());
  return r;
}

Outcome ShardedClient::free_sequence(const SequenceRef& ref) {
  auto it = clients_.find(ref.endpoint);
  if (it == clients_.end()) return invalid_argument(fmt::format("endpoint: expected one of the pods, received '{}'", ref.endpoint));
  auto r = it->second->free_sequence(ref.sequence_id);
  if (!r.ok()) return on(ref.endpoint, r.error());
  return r;
}

Result<DecodeResult> ShardedClient::decode(const ShardedDecodeArgs& args) {
  auto cfg = config();
  if (!cfg.ok()) return cfg.error();
  const size_t batch = args.sequences.size();
  if (batch == 0) return invalid_argument("sequences: expected at least one, received none");
  const auto q_row = static_cast<size_t>(cfg->q_row()), kv_row = static_cast<size_t>(cfg->kv_row());
  if (args.q.size() != batch * q_row) {
    return invalid_argument(fmt::format("q: expected {} values ({} sequences x {}), received {}", batch * q_row,
                                        batch, q_row, args.q.size()));
  }
  const bool appends = !args.k.empty();
  if (appends && (args.k.size() != batch * kv_row || args.v.size() != batch * kv_row)) {
    return invalid_argument(fmt::format("k, v: expected {} values each, received {} and {}", batch * kv_row,
                                        args.k.size(), args.v.size()));
  }
  std::map<std::string, std::vector<size_t>> rows;  // endpoint -> indices into the batch
  for (size_t i = 0; i < batch; ++i) {
    if (!clients_.count(args.sequences[i].endpoint)) {
      return invalid_argument(fmt::format("sequences[{}].endpoint: expected one of the pods, received '{}'", i,
                                          args.sequences[i].endpoint));
    }
    rows[args.sequences[i].endpoint].push_back(i);
  }
  struct Part {
    std::vector<size_t> index;
    std::vector<float> q, k, v;
    DecodeArgs args;
    Client* client = nullptr;
    std::optional<Result<DecodeResult>> answer;
  };
  std::vector<Part> parts;
  parts.reserve(rows.size());
  for (auto& [endpoint, index] : rows) {
    Part& p = parts.emplace_back();
    p.index = index;
    p.client = clients_.at(endpoint).get();
    p.args.layer = args.layer;
    p.args.return_lse = args.return_lse;
    for (size_t i : index) {
      p.args.sequence_ids.push_back(args.sequences[i].sequence_id);
      p.q.insert(p.q.end(), args.q.begin() + i * q_row, args.q.begin() + (i + 1) * q_row);
      if (appends) {
        p.k.insert(p.k.end(), args.k.begin() + i * kv_row, args.k.begin() + (i + 1) * kv_row);
        p.v.insert(p.v.end(), args.v.begin() + i * kv_row, args.v.begin() + (i + 1) * kv_row);
      }
    }
    p.args.q = p.q;
    p.args.k = p.k;
    p.args.v = p.v;
  }
  // Every pod's part but the last on its own thread, the last on this one: a
  // batch on one pod starts no thread at all.
  std::vector<std::future<Result<DecodeResult>>> others;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    others.push_back(std::async(std::launch::async, [&p = parts[i]] { return p.client->decode(p.args); }));
  }
  parts.back().answer = parts.back().client->decode(parts.back().args);
  for (size_t i = 0; i + 1 < parts.size(); ++i) parts[i].answer = others[i].get();
  DecodeResult out;
  out.output.assign(batch * q_row, 0.f);
  if (args.return_lse) out.lse.assign(batch * static_cast<size_t>(cfg->num_q_heads), 0.f);
  out.lengths.assign(batch, 0);
  out.splits.assign(batch, 0);
  std::optional<Error> first_error;
  auto it = rows.begin();
  for (Part& p : parts) {
    Result<DecodeResult>& r = *p.answer;
    const std::string& endpoint = (it++)->first;
    if (!r.ok()) {
      if (!first_error) first_error = on(endpoint, r.error());
      continue;
    }
    const auto heads = static_cast<size_t>(cfg->num_q_heads);
    for (size_t j = 0; j < p.index.size(); ++j) {
      const size_t i = p.index[j];
      std::copy_n(r->output.begin() + j * q_row, q_row, out.output.begin() + i * q_row);
      if (args.return_lse) std::copy_n(r->lse.begin() + j * heads, heads, out.lse.begin() + i * heads);
      out.lengths[i] = r->lengths[j];
      out.splits[i] = r->splits[j];
    }
    out.split_tokens = r->split_tokens;
    out.deterministic = r->deterministic;
  }
  if (first_error) return *first_error;
  return out;
}

}  // namespace pagoda::client
