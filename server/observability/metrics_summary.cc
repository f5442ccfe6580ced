#include "observability/metrics_summary.h"

namespace pagoda {

double bucket_quantile(double q, std::span<const double> upper_bounds, std::span<const double> counts) {
  double total = 0;
  for (double c : counts) total += c;
  if (total <= 0 || counts.size() != upper_bounds.size() + 1) return 0;
  const double rank = q * total;
  double below = 0;
  for (std::size_t i = 0; i < upper_bounds.size(); ++i) {
    if (below + counts[i] >= rank && counts[i] > 0) {
      const double lower = i == 0 ? 0.0 : upper_bounds[i - 1];
      return lower + (upper_bounds[i] - lower) * (rank - below) / counts[i];
    }
    below += counts[i];
  }
  return upper_bounds.empty() ? 0 : upper_bounds.back();
}

}  // namespace pagoda
