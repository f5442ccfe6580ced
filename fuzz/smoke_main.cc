// A libFuzzer target's short smoke run without libFuzzer (any compiler, part
// of `make test`): every seed of a corpus directory, then seeded random
// mutations of them (bit flips, byte changes, insertions, deletions, cuts,
// splices), each passed to LLVMFuzzerTestOneInput. `make fuzz` runs the real
// coverage-guided fuzzer with sanitizers.
//
//   fuzz_smoke CORPUS_DIR EXECUTIONS [SEED]
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

using Bytes = std::vector<uint8_t>;

Bytes mutate(const std::vector<Bytes>& seeds, std::mt19937_64& rng) {
  Bytes b = seeds[rng() % seeds.size()];
  const int edits = 1 + static_cast<int>(rng() % 8);
  for (int e = 0; e < edits; ++e) {
    const size_t n = b.size();
    switch (rng() % 6) {
      case 0: if (n) b[rng() % n] ^= static_cast<uint8_t>(1u << (rng() % 8)); break;
      case 1: if (n) b[rng() % n] = static_cast<uint8_t>(rng()); break;
      case 2: b.insert(b.begin() + static_cast<long>(n ? rng() % (n + 1) : 0), static_cast<uint8_t>(rng())); break;
      case 3: if (n) b.erase(b.begin() + static_cast<long>(rng() % n)); break;
      case 4: if (n) b.resize(rng() % n); break;
      default: {  // splice in a piece of another seed
        const Bytes& other = seeds[rng() % seeds.size()];
        if (other.empty()) break;
        const size_t from = rng() % other.size();
        const size_t len = 1 + rng() % (other.size() - from);
        b.insert(b.begin() + static_cast<long>(n ? rng() % (n + 1) : 0), other.begin() + static_cast<long>(from),
                 other.begin() + static_cast<long>(from + len));
      }
    }
  }
  return b;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR EXECUTIONS [SEED]\n", argv[0]);
    return 2;
  }
  std::vector<Bytes> seeds;
  for (const auto& entry : std::filesystem::directory_iterator(argv[1])) {
    std::ifstream in(entry.path(), std::ios::binary);
    seeds.emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  if (seeds.empty()) {
    std::fprintf(stderr, "%s: no seeds in %s\n", argv[0], argv[1]);
    return 2;
  }
  const long executions = std::strtol(argv[2], nullptr, 10);
  std::mt19937_64 rng(argc > 3 ? std::strtoull(argv[3], nullptr, 10) : 1);
  long done = 0;
  for (const Bytes& s : seeds) {
    LLVMFuzzerTestOneInput(s.data(), s.size());
    ++done;
  }
  for (; done < executions; ++done) {
    const Bytes b = mutate(seeds, rng);
    LLVMFuzzerTestOneInput(b.data(), b.size());
  }
  std::printf("%s: %ld executions over %zu seeds, no crash\n", argv[0], done, seeds.size());
  return 0;
}
