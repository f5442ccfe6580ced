#pragma once
// `pagoda-bench soak`'s workload: each client thread owns a few sequences and
// knows every token it put in them (each token's K/V is derived from a key, so
// nothing is stored but keys). It runs a random mix of decode steps (unary, on
// its stream, or through Client::decode_step with a tiny deadline and
// retries), appends, forks, truncations and frees, counting every operation by
// outcome, and checks as it goes that the lengths the server answers are what
// it knows (a lost or doubled append shows at once) and, on a sample of
// decodes, the output against the CLI's double reference. At the end it
// compares every sequence's lengths and a decode of every layer.

#include <atomic>
#include <cstdint>
#include <map>
#include <string>

#include "connection_flags.h"
#include "pagoda/client/client.h"

namespace pagoda::bench {

struct SoakShape {
  int32_t clients = 8;
  int64_t calls = 200;             // operations per client
  int32_t sequences = 2;           // per client: the batch of its decode steps
  int32_t max_context = 256;       // a layer reaching this is truncated to a quarter to a half of it
  double stream_fraction = 0.3;    // decode steps sent on the client's DecodeStream
  double deadline_fraction = 0.05; // decode steps through decode_step with a tiny deadline
  int32_t tiny_deadline_us = 300;
  double append_fraction = 0.1;    // AppendKV of 1-3 tokens to one sequence and layer
  double fork_fraction = 0.03;     // fork, one decode step on the fork (checked), free it
  double free_fraction = 0.02;     // free a sequence and start a new one
  int32_t check_every = 16;        // decodes compared against the reference: one in N
  uint64_t seed = 1;
};

// Operations by kind and outcome; and what the checks found.
struct SoakCounts {
  // [operation][outcome]: outcomes "ok", "retried" (answered after a retry,
  // applied once), "replayed" (an earlier attempt had applied the step: re-read),
  // "gave_up" (every tiny-deadline attempt timed out; finished without one),
  // "unavailable" (refused while the server drains), "revoked" and
  // "unauthenticated" (the revoked client's refusals after the revocation),
  // or a gRPC code name.
  std::map<std::string, std::map<std::string, int64_t>> outcomes;
  int64_t rpcs = 0;              // calls sent, retries included
  int64_t lost = 0;              // tokens the client appended that the server does not hold
  int64_t duplicates = 0;        // tokens the server holds beyond what the client appended
  int64_t mismatches = 0;        // decodes that differ from the reference
  int64_t checked_decodes = 0;   // decodes compared against the reference
  int64_t verified_sequences = 0;
  int64_t unverified_revoked = 0;  // the revoked client's sequences, out of reach once it is
  std::string first_problem;

  void add(const SoakCounts& other);
  // Outcomes other than ok/retried/replayed/gave_up (and unavailable, when the
  // server was told to drain).
  int64_t failures(bool draining) const;
};

// Runs one client's operations against `server`; stops early once the server
// answers UNAVAILABLE (draining). Verifies at the end unless `skip_verify`
// became true (the server was sent SIGTERM).
//
// `revoked` (the client whose token the run revokes; null for the others)
// becomes true once the token is out of the tokens file, just before the
// server is sent SIGHUP. That client runs until a call of its is refused
// UNAUTHENTICATED after that ("revoked"; before it, such a refusal is a
// failure), then checks that a unary decode, a request on the DecodeStream it
// holds, an append, a create and a GetSequence are all refused UNAUTHENTICATED
// ("after_revocation_*"). Its sequences cannot be verified then.
SoakCounts run_soak_client(const client::ConnectionFlags& server, const client::ServerConfig& config,
                           const SoakShape& shape, int32_t index, const std::atomic<bool>& skip_verify,
                           const std::atomic<bool>* revoked = nullptr);

}  // namespace pagoda::bench
