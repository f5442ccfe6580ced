#pragma once
// --idle-ttl: a thread that frees sequences no call has named for longer than
// the TTL (a client that vanished without FreeSequence), each logged with its
// id and age and counted in pagoda_sequences_evicted_total.

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

namespace pagoda {

class CacheManager;
class Metrics;

class IdleSweeper {
 public:
  // Sweeps every ttl / 4 (between 10 ms and 1 s) until stop().
  IdleSweeper(CacheManager& cache, Metrics& metrics, std::chrono::duration<double> ttl);
  ~IdleSweeper();
  IdleSweeper(const IdleSweeper&) = delete;
  IdleSweeper& operator=(const IdleSweeper&) = delete;

  void stop();

 private:
  void run();

  CacheManager& cache_;
  Metrics& metrics_;
  const std::chrono::steady_clock::duration ttl_;
  std::mutex mu_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace pagoda
