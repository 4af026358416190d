#include "deviceplugin/preferred.hpp"

#include <algorithm>
#include <set>

namespace gpufence {
namespace {

long total_score(const std::vector<std::string>& set, const PairScore& score) {
  long total = 0;
  for (size_t i = 0; i < set.size(); ++i) {
    for (size_t j = i + 1; j < set.size(); ++j) total += score(set[i], set[j]);
  }
  return total;
}

// Greedy growth: add the candidate best connected to what is already chosen; ties keep the
// kubelet's order, so the answer is deterministic.
std::vector<std::string> grow(std::vector<std::string> chosen, const std::vector<std::string>& pool,
                              size_t size, const PairScore& score) {
  while (chosen.size() < size) {
    const std::string* best = nullptr;
    long best_score = -1;
    for (const auto& cand : pool) {
      if (std::find(chosen.begin(), chosen.end(), cand) != chosen.end()) continue;
      long s = 0;
      for (const auto& c : chosen) s += score(c, cand);
      if (s > best_score) {
        best_score = s;
        best = &cand;
      }
    }
    if (!best) break;
    chosen.push_back(*best);
  }
  return chosen;
}

}  // namespace

Result<std::vector<std::string>> preferred_allocation(const std::vector<std::string>& available,
                                                      const std::vector<std::string>& must_include,
                                                      int size, const PairScore& score) {
  if (size <= 0) return fail(Errc::invalid_argument, "allocation_size ", size, " must be positive");
  std::set<std::string> avail(available.begin(), available.end());
  for (const auto& id : must_include) {
    if (!avail.contains(id))
      return fail(Errc::invalid_argument, "must-include device '", id, "' is not available");
  }
  if (static_cast<size_t>(size) > avail.size()) {
    return fail(Errc::invalid_argument, "allocation_size ", size, " exceeds the ", avail.size(),
                " available devices");
  }
  if (must_include.size() > static_cast<size_t>(size)) {
    return fail(Errc::invalid_argument, must_include.size(),
                " must-include devices exceed allocation_size ", size);
  }
  std::vector<std::string> pool;
  for (const auto& id : available) {
    if (std::find(pool.begin(), pool.end(), id) == pool.end()) pool.push_back(id);
  }
  if (!must_include.empty() || size == 1)
    return grow(must_include, pool, static_cast<size_t>(size), score);
  // No anchor: try every seed and keep the best-connected result (n is at most a few dozen).
  std::vector<std::string> best;
  long best_total = -1;
  for (const auto& seed : pool) {
    auto set = grow({seed}, pool, static_cast<size_t>(size), score);
    long total = total_score(set, score);
    if (total > best_total) {
      best_total = total;
      best = std::move(set);
    }
  }
  return best;
}

}  // namespace gpufence
