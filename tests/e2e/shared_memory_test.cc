// Shared-memory tensors (docs/design.md §15) over a real loopback channel: q,
// k, v read from and output and LSE written into a POSIX shared-memory region
// the test owns, with the bits of the same calls over the socket; every bad
// range refused naming region, offset, size and region size, nothing changed.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "e2e_fixture.h"
#include "shm/shared_memory_registry.h"

namespace pagoda::e2e {
namespace {

// A POSIX shared-memory object made and mapped by the test, unlinked after.
class Object {
 public:
  explicit Object(size_t bytes) : key_("/pagoda-test-" + std::to_string(getpid()) + "-" + std::to_string(next_++)),
                                  bytes_(bytes) {
    const int fd = shm_open(key_.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    EXPECT_GE(fd, 0) << key_;
    EXPECT_EQ(ftruncate(fd, static_cast<off_t>(bytes)), 0);
    data_ = static_cast<std::byte*>(mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
    close(fd);
  }
  ~Object() {
    munmap(data_, bytes_);
    shm_unlink(key_.c_str());
  }
  const std::string& key() const { return key_; }
  std::byte* data() const { return data_; }

 private:
  static inline int next_ = 0;
  std::string key_;
  size_t bytes_;
  std::byte* data_ = nullptr;
};

v1::SharedMemoryRef ref(const std::string& region, int64_t offset, int64_t bytes) {
  v1::SharedMemoryRef r;
  r.set_region(region);
  r.set_offset(offset);
  r.set_byte_size(bytes);
  return r;
}

class SharedMemoryTest : public ServerTest {
 protected:
  ServerConfig config() const override {
    ServerConfig c = small_config();
    c.allow_shared_memory = true;
    return c;
  }

  grpc::Status register_region(const std::string& name, const std::string& key, int64_t offset, int64_t bytes) {
    grpc::ClientContext ctx;
    v1::RegisterSharedMemoryRequest req;
    req.set_name(name);
    req.set_key(key);
    req.set_offset(offset);
    req.set_byte_size(bytes);
    v1::RegisterSharedMemoryResponse resp;
    return stub_->RegisterSharedMemory(&ctx, req, &resp);
  }
  grpc::Status unregister(const std::string& name) {
    grpc::ClientContext ctx;
    v1::UnregisterSharedMemoryRequest req;
    req.set_name(name);
    v1::UnregisterSharedMemoryResponse resp;
    return stub_->UnregisterSharedMemory(&ctx, req, &resp);
  }
  grpc::Status decode(const v1::DecodeRequest& req, v1::DecodeResponse& resp) {
    grpc::ClientContext ctx;
    return stub_->Decode(&ctx, req, &resp);
  }
  // `values` as fp32 bytes at `offset` of region `name`, which starts at
  // `region_at` of `o`; a Tensor naming them.
  v1::Tensor put(const Object& o, const std::string& name, int64_t offset, const std::vector<float>& values,
                 std::vector<int64_t> shape, int64_t region_at = 0) {
    std::memcpy(o.data() + region_at + offset, values.data(), values.size() * sizeof(float));
    v1::Tensor t;
    t.set_dtype(v1::FLOAT32);
    for (int64_t d : shape) t.add_shape(d);
    *t.mutable_shm() = ref(name, offset, static_cast<int64_t>(values.size() * sizeof(float)));
    return t;
  }
};

TEST_F(SharedMemoryTest, DecodeThroughSharedMemoryHasTheBitsOfTheSocketPath) {
  Object o(1 << 20);
  ASSERT_TRUE(register_region("r", o.key(), 4096, (1 << 20) - 4096).ok());
  const uint64_t a = make_sequence(37), b = make_sequence(20);
  // A twin of each, fed the same K/V over the socket.
  const uint64_t ta = make_sequence(0), tb = make_sequence(0);
  for (int32_t layer = 0; layer < g_.num_layers; ++layer) {
    for (auto [src, dst] : {std::pair{a, ta}, std::pair{b, tb}}) {
      const LayerHistory& h = mirror_->history(src, layer);
      ASSERT_TRUE(session_.append(dst, layer, h.k, h.v).ok());
      mirror_->append(dst, layer, h.k, h.v);
    }
  }
  const std::vector<float> q = random_q(2), k = random_kv(2), v = random_kv(2);
  const int64_t rows = 2, heads = g_.num_q_heads, d = g_.head_dim, kvh = g_.num_kv_heads;
  v1::DecodeRequest shm_req;
  shm_req.set_layer(1);
  shm_req.add_sequence_ids(a);
  shm_req.add_sequence_ids(b);
  shm_req.set_return_lse(true);
  *shm_req.mutable_q() = put(o, "r", 0, q, {rows, heads, d}, 4096);
  *shm_req.mutable_k() = put(o, "r", 8192, k, {rows, kvh, d}, 4096);
  *shm_req.mutable_v() = put(o, "r", 16384, v, {rows, kvh, d}, 4096);
  const int64_t out_bytes = rows * heads * d * 4, lse_bytes = rows * heads * 4;
  *shm_req.mutable_output_shm() = ref("r", 65536, out_bytes);
  *shm_req.mutable_lse_shm() = ref("r", 131072, lse_bytes);
  v1::DecodeResponse shm_resp, sock_resp;
  const grpc::Status s = decode(shm_req, shm_resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_TRUE(session_.decode(1, {ta, tb}, q, sock_resp, k, v).ok());
  EXPECT_TRUE(shm_resp.output().data().empty()) << "the output went to shared memory, not the response";
  EXPECT_EQ(shm_resp.output().shm().region(), "r");
  EXPECT_EQ(shm_resp.output().shape_size(), 3);
  const std::byte* base = o.data() + 4096;
  EXPECT_EQ(std::memcmp(base + 65536, sock_resp.output().data().data(), static_cast<size_t>(out_bytes)), 0);
  EXPECT_EQ(std::memcmp(base + 131072, sock_resp.lse().data().data(), static_cast<size_t>(lse_bytes)), 0);
  EXPECT_EQ(std::vector<int32_t>(shm_resp.lengths().begin(), shm_resp.lengths().end()),
            (std::vector<int32_t>{38, 21}));

  // AppendKV from shared memory, then a decode of both ways again.
  const std::vector<float> k3 = random_kv(3), v3 = random_kv(3);
  v1::AppendKVRequest app;
  app.set_sequence_id(a);
  app.set_layer(0);
  *app.mutable_k() = put(o, "r", 200000, k3, {3, kvh, d}, 4096);
  *app.mutable_v() = put(o, "r", 300000, v3, {3, kvh, d}, 4096);
  {
    grpc::ClientContext ctx;
    v1::AppendKVResponse resp;
    const grpc::Status st = stub_->AppendKV(&ctx, app, &resp);
    ASSERT_TRUE(st.ok()) << st.error_message();
    EXPECT_EQ(resp.layer_length(), 40);
  }
  mirror_->append(a, 0, k3, v3);
  decode_checked(0, {a});
  // GetSharedMemoryStatus lists it; after unregistering, a tensor naming it is refused.
  {
    grpc::ClientContext ctx;
    v1::GetSharedMemoryStatusResponse st;
    ASSERT_TRUE(stub_->GetSharedMemoryStatus(&ctx, v1::GetSharedMemoryStatusRequest(), &st).ok());
    ASSERT_EQ(st.regions_size(), 1);
    EXPECT_EQ(st.regions(0).key(), o.key());
    EXPECT_EQ(st.regions(0).offset(), 4096);
  }
  ASSERT_TRUE(unregister("r").ok());
  v1::DecodeResponse gone;
  const grpc::Status after = decode(shm_req, gone);
  EXPECT_EQ(after.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(after.error_message().find("q.shm.region: expected a registered region, received 'r'"), std::string::npos)
      << after.error_message();
}

TEST_F(SharedMemoryTest, BadRangesAndRegistrationsAreRefusedNamingWhatIsWrong) {
  Object o(1 << 16);
  ASSERT_TRUE(register_region("r", o.key(), 0, 1 << 16).ok());
  const uint64_t a = make_sequence(5);
  v1::GetSequenceResponse before;
  ASSERT_TRUE(session_.get(a, before).ok());
  const std::vector<float> q = random_q(1), k = random_kv(1);
  const int64_t q_bytes = g_.num_q_heads * g_.head_dim * 4;
  auto request = [&] {
    v1::DecodeRequest r;
    r.set_layer(0);
    r.add_sequence_ids(a);
    *r.mutable_q() = put(o, "r", 0, q, {1, g_.num_q_heads, g_.head_dim});
    return r;
  };
  struct Bad {
    std::function<void(v1::DecodeRequest&)> change;
    grpc::StatusCode code;
    std::string message;
  };
  const std::vector<Bad> bad = {
      {[&](auto& r) { r.mutable_q()->mutable_shm()->set_offset((1 << 16) - 100); }, grpc::StatusCode::INVALID_ARGUMENT,
       "q.shm: expected offset + byte_size within region 'r' (65536 bytes), received offset 65436 and byte_size " +
           std::to_string(q_bytes)},
      {[&](auto& r) { r.mutable_q()->mutable_shm()->set_byte_size(q_bytes - 4); }, grpc::StatusCode::INVALID_ARGUMENT,
       "q.shm.byte_size: expected " + std::to_string(q_bytes) + " bytes"},
      {[&](auto& r) { r.mutable_q()->mutable_shm()->set_region("nope"); }, grpc::StatusCode::INVALID_ARGUMENT,
       "q.shm.region: expected a registered region, received 'nope'"},
      {[&](auto& r) { r.mutable_q()->set_data(std::string(static_cast<size_t>(q_bytes), '\0')); },
       grpc::StatusCode::INVALID_ARGUMENT, "q: expected data or shm, received both"},
      {[&](auto& r) { *r.mutable_output_shm() = ref("r", 65000, q_bytes); }, grpc::StatusCode::INVALID_ARGUMENT,
       "output_shm: expected offset + byte_size within region 'r'"},
      {[&](auto& r) { *r.mutable_lse_shm() = ref("r", 0, 32); }, grpc::StatusCode::INVALID_ARGUMENT,
       "lse_shm: expected return_lse with it"},
      {[&](auto& r) {
         r.set_return_lse(true);
         *r.mutable_lse_shm() = ref("r", 2, 32);
       },
       grpc::StatusCode::INVALID_ARGUMENT, "lse_shm.offset: expected a multiple of 4 bytes, received 2"},
      {[&](auto& r) {
         *r.mutable_k() = put(o, "r", 30000, k, {1, g_.num_kv_heads, g_.head_dim});
         *r.mutable_v() = put(o, "r", 40000, std::vector<float>(k.size(), NAN), {1, g_.num_kv_heads, g_.head_dim});
       },
       grpc::StatusCode::INVALID_ARGUMENT, "v[0]: expected finite values, received nan"},
  };
  for (const Bad& b : bad) {
    v1::DecodeRequest r = request();
    b.change(r);
    v1::DecodeResponse resp;
    const grpc::Status s = decode(r, resp);
    EXPECT_EQ(s.error_code(), b.code) << b.message;
    EXPECT_NE(s.error_message().find(b.message), std::string::npos) << s.error_message();
  }
  v1::GetSequenceResponse after;
  ASSERT_TRUE(session_.get(a, after).ok());
  EXPECT_EQ(after.layer_lengths(0), before.layer_lengths(0)) << "a refused request appended";

  const grpc::Status dup = register_region("r", o.key(), 0, 16);
  EXPECT_EQ(dup.error_code(), grpc::StatusCode::ALREADY_EXISTS);
  const grpc::Status missing = register_region("m", "/pagoda-no-such-object", 0, 16);
  EXPECT_EQ(missing.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_NE(missing.error_message().find("'/pagoda-no-such-object'"), std::string::npos) << missing.error_message();
  const grpc::Status past = register_region("p", o.key(), 1 << 15, 1 << 16);
  EXPECT_EQ(past.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(past.error_message().find("expected at most the size of '" + o.key() + "' (65536 bytes), received 32768 + "
                                      "65536"),
            std::string::npos)
      << past.error_message();
  const grpc::Status bad_key = register_region("k", "no-slash", 0, 16);
  EXPECT_EQ(bad_key.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(unregister("never").error_code(), grpc::StatusCode::NOT_FOUND);
}

class SharedMemoryOffTest : public ServerTest {};

TEST_F(SharedMemoryOffTest, WithoutTheFlagEveryUseSaysWhichFlagTurnsItOn) {
  Object o(4096);
  grpc::ClientContext ctx;
  v1::RegisterSharedMemoryRequest req;
  req.set_name("r");
  req.set_key(o.key());
  req.set_byte_size(4096);
  v1::RegisterSharedMemoryResponse resp;
  const grpc::Status s = stub_->RegisterSharedMemory(&ctx, req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(s.error_message().find("--allow-shared-memory"), std::string::npos) << s.error_message();
  const uint64_t a = make_sequence(3);
  v1::DecodeRequest r;
  r.set_layer(0);
  r.add_sequence_ids(a);
  r.mutable_q()->set_dtype(v1::FLOAT32);
  for (int64_t dim : {int64_t{1}, int64_t{g_.num_q_heads}, int64_t{g_.head_dim}}) r.mutable_q()->add_shape(dim);
  *r.mutable_q()->mutable_shm() = ref("r", 0, g_.num_q_heads * g_.head_dim * 4);
  grpc::ClientContext dctx;
  v1::DecodeResponse dresp;
  const grpc::Status d = stub_->Decode(&dctx, r, &dresp);
  EXPECT_EQ(d.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(d.error_message().find("q.shm: expected a server started with --allow-shared-memory"), std::string::npos)
      << d.error_message();
}

// Tenants and lifetime, on the registry itself.
TEST(SharedMemoryRegistry, RegionsAreTheirTenantsAndOutliveUnregisterWhileHeld) {
  Object o(8192);
  SharedMemoryRegistry reg(true);
  ASSERT_TRUE(reg.add(1, "r", o.key(), 0, 8192).ok());
  auto other = reg.resolve(2, "q.shm", "r", 0, 16);
  EXPECT_EQ(other.status().code(), StatusCode::kInvalidArgument) << "another tenant's region was found";
  EXPECT_EQ(other.status().message(), "q.shm.region: expected a registered region, received 'r'");
  auto st2 = reg.status(2, "");
  ASSERT_TRUE(st2.ok());
  EXPECT_TRUE(st2->empty());
  auto held = reg.resolve(1, "q.shm", "r", 100, 16);
  ASSERT_TRUE(held.ok()) << held.status().message();
  ASSERT_TRUE(reg.remove(1, "").ok());
  EXPECT_FALSE(reg.resolve(1, "q.shm", "r", 0, 16).ok());
  // The held range is still mapped: it reads and writes the object.
  std::memcpy(held->data, "pagoda", 6);
  EXPECT_EQ(std::memcmp(o.data() + 100, "pagoda", 6), 0);
}

}  // namespace
}  // namespace pagoda::e2e
