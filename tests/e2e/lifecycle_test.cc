// Health, reflection, graceful drain, and the pagoda-server binary's exit codes.
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <thread>

#include <grpcpp/generic/generic_stub.h>

#include "e2e_fixture.h"
#include "engine/engine.h"

extern char** environ;

namespace pagoda::e2e {
namespace {

using Clock = std::chrono::steady_clock;

// Raw protobuf bytes through the generic stub (the test has no stubs of its own
// for health or reflection, as a client of a foreign server would not).
std::string to_string(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  std::string out;
  if (buffer.Dump(&slices).ok())
    for (const auto& s : slices) out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

grpc::ByteBuffer to_buffer(const std::string& bytes) {
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

std::shared_ptr<grpc::Channel> channel_to(int port) {
  return grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials());
}

// grpc.health.v1.Health/Check for the whole server (service ""). The response's
// field 1 is the serving status: 1 SERVING, 2 NOT_SERVING.
grpc::Status health_check(int port, std::string& response_bytes) {
  grpc::GenericStub stub(channel_to(port));
  grpc::CompletionQueue cq;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  auto call = stub.PrepareUnaryCall(&ctx, "/grpc.health.v1.Health/Check", to_buffer(""), &cq);
  call->StartCall();
  grpc::ByteBuffer response;
  grpc::Status status;
  call->Finish(&response, &status, reinterpret_cast<void*>(1));
  void* tag = nullptr;
  bool ok = false;
  EXPECT_TRUE(cq.Next(&tag, &ok));
  response_bytes = to_string(response);
  return status;
}

// grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo with
// list_services (field 7); returns the raw response.
std::string list_services(int port) {
  grpc::GenericStub stub(channel_to(port));
  grpc::CompletionQueue cq;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  auto call = stub.PrepareCall(&ctx, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", &cq);
  void* tag = nullptr;
  bool ok = false;
  auto step = [&](int id) {
    EXPECT_TRUE(cq.Next(&tag, &ok));
    EXPECT_EQ(tag, reinterpret_cast<void*>(static_cast<intptr_t>(id)));
    return ok;
  };
  call->StartCall(reinterpret_cast<void*>(1));
  if (!step(1)) return "";
  call->Write(to_buffer(std::string("\x3a\x00", 2)), reinterpret_cast<void*>(2));
  if (!step(2)) return "";
  grpc::ByteBuffer response;
  call->Read(&response, reinterpret_cast<void*>(3));
  const bool read = step(3);
  call->WritesDone(reinterpret_cast<void*>(4));
  step(4);
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(5));
  step(5);
  EXPECT_TRUE(status.ok()) << status.error_message();
  return read ? to_string(response) : "";
}

using LifecycleTest = ServerTest;

TEST_F(LifecycleTest, HealthAnswersServing) {
  std::string bytes;
  const grpc::Status s = health_check(server_->port(), bytes);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(bytes, std::string("\x08\x01", 2));  // status: SERVING
}

TEST_F(LifecycleTest, ReflectionListsTheServices) {
  const std::string listing = list_services(server_->port());
  EXPECT_NE(listing.find("pagoda.v1.DecodeAttention"), std::string::npos);
  EXPECT_NE(listing.find("grpc.health.v1.Health"), std::string::npos);
}

TEST_F(LifecycleTest, UnparsableRequestFailsAndTheServerCarriesOn) {
  grpc::GenericStub stub(channel_to(server_->port()));
  grpc::CompletionQueue cq;
  grpc::ClientContext ctx;
  auto call = stub.PrepareUnaryCall(&ctx, "/pagoda.v1.DecodeAttention/Decode", to_buffer("\xff\xff\xff\xff"), &cq);
  call->StartCall();
  grpc::ByteBuffer response;
  grpc::Status status;
  call->Finish(&response, &status, reinterpret_cast<void*>(1));
  void* tag = nullptr;
  bool ok = false;
  ASSERT_TRUE(cq.Next(&tag, &ok));
  // Not gRPC's UNIMPLEMENTED with no message: the method exists, the bytes do not parse.
  EXPECT_EQ(status.error_code(), grpc::INVALID_ARGUMENT);
  EXPECT_EQ(status.error_message(),
            "/pagoda.v1.DecodeAttention/Decode: cannot parse the request message as pagoda.v1.DecodeRequest");
  v1::GetConfigResponse c;
  EXPECT_TRUE(session_.config(c).ok());
}

void wait_for(const std::function<bool()>& condition) {
  const auto give_up = Clock::now() + std::chrono::seconds(10);
  while (!condition() && Clock::now() < give_up) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_TRUE(condition());
}

TEST_F(LifecycleTest, DrainFinishesInFlightCallsAndRefusesNewOnes) {
  const uint64_t id = make_sequence(30);
  const auto q = random_q(1);
  server_->engine().pause();  // the call below stays in flight until resume
  grpc::Status inflight_status;
  v1::DecodeResponse inflight;
  std::thread caller([&] { inflight_status = session_.decode(0, {id}, q, inflight); });
  wait_for([&] { return server_->engine().queued() == 1; });

  const auto t0 = Clock::now();
  std::thread stopper([&] { server_->shutdown(10.0); });
  wait_for([&] { return server_->draining(); });

  // New calls, on the open channel and on a new one, are refused.
  v1::GetConfigResponse c;
  EXPECT_EQ(session_.config(c).error_code(), grpc::UNAVAILABLE);
  auto fresh = make_stub(*server_);
  Session other{fresh.get(), g_};
  v1::DecodeResponse r;
  EXPECT_EQ(other.decode(0, {id}, q, r).error_code(), grpc::UNAVAILABLE);

  server_->engine().resume();
  caller.join();
  stopper.join();
  ASSERT_TRUE(inflight_status.ok()) << inflight_status.error_message();
  const testing::ReferenceResult want = mirror_->reference(0, {id}, q, default_scale(g_));
  expect_close(want.out, tensor_values(inflight.output()), kOutTolerance, "in-flight output");
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(5));
}

TEST_F(LifecycleTest, DrainAnswersWhatAStreamSentThenEndsItUnavailable) {
  const uint64_t id = make_sequence(12);
  grpc::ClientContext ctx;
  auto stream = stub_->DecodeStream(&ctx);
  v1::DecodeRequest req = session_.decode_request(0, {id}, random_q(1));
  req.set_request_id(5);
  ASSERT_TRUE(stream->Write(req));
  v1::DecodeResponse resp;
  ASSERT_TRUE(stream->Read(&resp));
  EXPECT_EQ(resp.request_id(), 5u);

  const auto t0 = Clock::now();
  std::thread stopper([&] { server_->shutdown(10.0); });
  EXPECT_FALSE(stream->Read(&resp));  // the server ends the idle stream
  const grpc::Status s = stream->Finish();
  EXPECT_EQ(s.error_code(), grpc::UNAVAILABLE) << s.error_message();
  stopper.join();
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(5));  // did not wait for the drain timeout
}

TEST_F(LifecycleTest, DeadlinesPassedInTheQueueFailAndAppendNothing) {
  const uint64_t id = make_sequence(8);
  server_->engine().pause();
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(50));
  v1::DecodeResponse resp;
  const grpc::Status s =
      stub_->Decode(&ctx, session_.decode_request(0, {id}, random_q(1), random_kv(1), random_kv(1)), &resp);
  EXPECT_EQ(s.error_code(), grpc::DEADLINE_EXCEEDED);
  grpc::ClientContext append_ctx;
  append_ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(50));
  v1::AppendKVRequest append;
  append.set_sequence_id(id);
  append.set_layer(0);
  *append.mutable_k() = f32_tensor(random_kv(2), {2, g_.num_kv_heads, g_.head_dim});
  *append.mutable_v() = f32_tensor(random_kv(2), {2, g_.num_kv_heads, g_.head_dim});
  v1::AppendKVResponse append_resp;
  EXPECT_EQ(stub_->AppendKV(&append_ctx, append, &append_resp).error_code(), grpc::DEADLINE_EXCEEDED);
  // The deadline itself is checked when the engine reaches each item. The
  // server's deadline (arrival + the grpc-timeout the call carried) ends a
  // little after the client's: wait that little past it.
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  server_->engine().resume();
  wait_for([&] { return server_->engine().queued() == 0; });
  v1::GetSequenceResponse info;
  ASSERT_TRUE(session_.get(id, info).ok());
  EXPECT_EQ(info.layer_lengths(0), 8);
  decode_checked(0, {id});
}

// --- the pagoda-server binary -------------------------------------------------

int run_binary(const std::string& args) {
  const std::string cmd = std::string(PAGODA_SERVER_BINARY) + " " + args + " >/dev/null 2>&1";
  const int status = std::system(cmd.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(ServerBinary, InvalidSettingsExitWithCode2) {
  for (const char* args : {"--split-tokens 100", "--q-heads 6 --kv-heads 4", "--num-blocks 0 --cache-bytes 1",
                           "--cache-dtype fp8", "--head-dim 96", "--mode sometimes", "--layers x", "--cpu-target neon",
                           "--cpu-prefetch l3"}) {
    EXPECT_EQ(run_binary(std::string("--listen 127.0.0.1:0 --metrics-address 127.0.0.1:0 --backend cpu ") + args), 2) << args;
  }
  EXPECT_EQ(run_binary("--help"), 0);
  // The same settings from the environment (PAGODA_ + the flag's name).
  const std::string cmd = std::string("PAGODA_SPLIT_TOKENS=100 ") + PAGODA_SERVER_BINARY +
                          " --listen 127.0.0.1:0 --metrics-address 127.0.0.1:0 --backend cpu >/dev/null 2>&1";
  const int status = std::system(cmd.c_str());
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 2);
}

TEST(ServerBinary, ServesThenDrainsOnSigtermAndExitsZero) {
  int out[2];
  ASSERT_EQ(pipe(out), 0);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
  posix_spawn_file_actions_addclose(&actions, out[0]);
  std::string binary = PAGODA_SERVER_BINARY;
  std::vector<std::string> args{binary, "--listen", "127.0.0.1:0", "--metrics-address", "127.0.0.1:0",
                                "--backend", "cpu", "--cache-bytes", "16777216",
                                "--threads", "1", "--log-format", "json"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  ASSERT_EQ(posix_spawn(&pid, binary.c_str(), &actions, nullptr, argv.data(), environ), 0);
  posix_spawn_file_actions_destroy(&actions);
  close(out[1]);

  // The start-up log (one JSON object a line) names the bound port:
  // "listening on 127.0.0.1:PORT".
  FILE* log = fdopen(out[0], "r");
  char line[4096];
  int port = 0;
  while (port == 0 && std::fgets(line, sizeof line, log)) {
    EXPECT_EQ(std::strncmp(line, "{\"time\":\"", 9), 0) << line;
    const char* at = std::strstr(line, "listening on 127.0.0.1:");
    if (at) port = std::atoi(at + std::strlen("listening on 127.0.0.1:"));
  }
  ASSERT_GT(port, 0);
  std::string health;
  EXPECT_TRUE(health_check(port, health).ok());
  EXPECT_EQ(health, std::string("\x08\x01", 2));

  // Clients that keep their channels open, idle, as orchestrators do: the
  // drain closes the connections instead of waiting for the clients to (one
  // idle channel held it 4 to 5 s, sixteen 20 s).
  std::vector<std::unique_ptr<v1::DecodeAttention::Stub>> kept;
  for (int i = 0; i < 4; ++i) {
    grpc::ChannelArguments own;
    own.SetInt("grpc.use_local_subchannel_pool", 1);
    kept.push_back(v1::DecodeAttention::NewStub(
        grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials(), own)));
    grpc::ClientContext ctx;
    v1::GetConfigResponse config;
    ASSERT_TRUE(kept.back()->GetConfig(&ctx, v1::GetConfigRequest(), &config).ok());
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(500));

  const auto t0 = Clock::now();
  ASSERT_EQ(kill(pid, SIGTERM), 0);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  const double took = std::chrono::duration<double>(Clock::now() - t0).count();
  fclose(log);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_LT(took, 0.5) << "SIGTERM with idle connections open took " << took << " s";
}

}  // namespace
}  // namespace pagoda::e2e
