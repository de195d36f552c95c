// The exact placement search's inner loop (python/oallama/planner/chaindp.py): a least-time path
// through a layered graph of placement decisions within a byte budget. See oallama.h
// (oallama_pareto_walk).

#include "oallama.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <tuple>

namespace {

struct entry {
    int64_t b;       // bytes on the accelerator so far, the largest streamed copy included
    int64_t m;       // bytes: the largest streamed weight so far
    double  t;       // us so far
    int64_t state;   // state of this stage
    int32_t parent;  // entry of the previous stage
    int32_t edge;    // edge of this stage that led here
};

constexpr double EPS_US = 1e-5;  // us: times closer than this are equal

// Pareto filter of `c` (sorted by state, m, b, t): per (state, m), keep what is faster than every
// entry with fewer bytes; then across m within a state: an entry is beaten by one whose bytes plus
// the room its smaller streamed copy will still need (max(0, m_this - m_other)) are no more, and
// which is faster.
void pareto_filter(std::vector<entry> & c) {
    std::vector<entry> out;
    out.reserve(c.size());
    double run_min = INFINITY;
    for (size_t i = 0; i < c.size(); ++i) {
        const bool group = i == 0 || c[i].state != c[i - 1].state || c[i].m != c[i - 1].m;
        if (group || c[i].t < run_min - EPS_US) {
            out.push_back(c[i]);
            run_min = group ? c[i].t : std::min(run_min, c[i].t);
        }
    }
    c.swap(out);
    // across streamed-size levels, state by state
    std::vector<char> dead(c.size(), 0);
    std::vector<std::tuple<int64_t, double, size_t>> keyed;
    for (size_t lo = 0; lo < c.size();) {
        size_t hi = lo;
        bool levels = false;
        while (hi < c.size() && c[hi].state == c[lo].state) {
            levels |= c[hi].m != c[lo].m;
            ++hi;
        }
        if (levels) {
            std::vector<int64_t> ms;
            for (size_t i = lo; i < hi; ++i) {
                if (ms.empty() || ms.back() != c[i].m) {
                    ms.push_back(c[i].m);
                }
            }
            for (int64_t lv : ms) {
                keyed.clear();
                for (size_t i = lo; i < hi; ++i) {
                    keyed.emplace_back(c[i].b + std::max<int64_t>(0, lv - c[i].m), c[i].t, i);
                }
                std::sort(keyed.begin(), keyed.end());
                double best = INFINITY;
                for (auto & [eb, t, i] : keyed) {
                    if (c[i].m == lv && best < t - EPS_US) {
                        dead[i] = 1;
                    }
                    best = std::min(best, t);
                }
            }
        }
        lo = hi;
    }
    size_t k = 0;
    for (size_t i = 0; i < c.size(); ++i) {
        if (!dead[i]) {
            c[k++] = c[i];
        }
    }
    c.resize(k);
}

}  // namespace

int oallama_pareto_walk(const std::vector<oallama_pareto_stage> & stages, int64_t base, double t0, int64_t cap,
                        double limit, int64_t n_lambda, const double * lambdas, int64_t n_level,
                        const int64_t * levels, int64_t max_entries, bool beam, double max_seconds,
                        oallama_pareto_result & result) {
    const auto started = std::chrono::steady_clock::now();
    std::vector<entry> cur = {{base, 0, t0, 0, -1, -1}};
    std::vector<std::vector<std::pair<int32_t, int32_t>>> hist(stages.size());  // (parent, edge) per kept entry
    std::vector<entry> next, cand;
    std::vector<int64_t> first, count, bucket, fill;
    result.max_entries = 1;
    // a lower bound of the whole path's us of an entry: for each price, the least over the largest
    // streamed sizes its path can end with (levels >= m: the rest streams nothing larger, and the
    // bytes left shrink by the growth of the streamed copy), the best of the prices
    const int64_t n_lv = std::max<int64_t>(n_level, 1);
    auto bound = [&](const oallama_pareto_stage & s, int64_t dst, int64_t b, int64_t m, double t) {
        const int64_t n = s.n_next;
        double best = -INFINITY;
        for (int64_t k = 0; k < n_lambda; ++k) {
            double lo = INFINITY;
            for (int64_t l = 0; l < n_lv; ++l) {
                if (n_level > 0 && levels[l] < m) {
                    continue;
                }
                const int64_t grow = n_level > 0 ? levels[l] - m : 0;
                lo = std::min(lo, s.rest_next[(l * n_lambda + k) * n + dst] -
                                      lambdas[k] * static_cast<double>(cap - b - grow));
            }
            best = std::max(best, t + lo);
        }
        return best;
    };
    for (size_t j = 0; j < stages.size(); ++j) {
        const oallama_pareto_stage & s = stages[j];
        if (std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count() > max_seconds) {
            result.stage = static_cast<int64_t>(j);
            return OALLAMA_PARETO_TIMEOUT;
        }
        // entries are sorted by state: where each state's entries start
        first.assign(s.n_states, 0);
        count.assign(s.n_states, 0);
        for (size_t i = cur.size(); i-- > 0;) {
            first[cur[i].state] = static_cast<int64_t>(i);
            count[cur[i].state]++;
        }
        // candidates, bucketed by the state they reach (a counting sort), then ordered within each
        int64_t n_next = 0;
        for (int64_t e = 0; e < s.n_edges; ++e) {
            n_next = std::max(n_next, s.dst[e] + 1);
        }
        cand.clear();
        for (int64_t e = 0; e < s.n_edges; ++e) {
            const int64_t src = s.src[e], dst = s.dst[e];
            for (int64_t i = first[src]; i < first[src] + count[src]; ++i) {
                const entry & x = cur[i];
                const int64_t m = std::max(x.m, s.sw[e]);
                const int64_t b = x.b + s.db[e] + (m - x.m);
                const double  t = x.t + s.dt[e];
                if (b + s.least_next[dst] > cap || bound(s, dst, b, m, t) > limit) {
                    continue;
                }
                cand.push_back({b, m, t, dst, static_cast<int32_t>(i), static_cast<int32_t>(e)});
            }
        }
        if (cand.empty()) {
            return OALLAMA_PARETO_NONE;
        }
        bucket.assign(n_next + 1, 0);
        for (const entry & x : cand) {
            bucket[x.state + 1]++;
        }
        for (int64_t k = 0; k < n_next; ++k) {
            bucket[k + 1] += bucket[k];
        }
        next.resize(cand.size());
        fill = bucket;
        for (const entry & x : cand) {
            next[fill[x.state]++] = x;
        }
        for (int64_t k = 0; k < n_next; ++k) {
            std::sort(next.begin() + bucket[k], next.begin() + bucket[k + 1], [](const entry & a, const entry & b) {
                return std::tie(a.m, a.b, a.t) < std::tie(b.m, b.b, b.t);
            });
        }
        pareto_filter(next);
        if (beam && static_cast<int64_t>(next.size()) > max_entries) {
            // a heuristic walk: the entries whose bound on the whole path is least, in state order again
            auto key = [&](const entry & x) { return bound(s, x.state, x.b, x.m, x.t); };
            std::vector<std::pair<double, size_t>> order(next.size());
            for (size_t i = 0; i < next.size(); ++i) {
                order[i] = {key(next[i]), i};
            }
            std::nth_element(order.begin(), order.begin() + max_entries, order.end());
            std::vector<size_t> kept(max_entries);
            for (int64_t i = 0; i < max_entries; ++i) {
                kept[i] = order[i].second;
            }
            std::sort(kept.begin(), kept.end());  // next is in state order
            std::vector<entry> thin(max_entries);
            for (int64_t i = 0; i < max_entries; ++i) {
                thin[i] = next[kept[i]];
            }
            next.swap(thin);
        }
        if (static_cast<int64_t>(next.size()) > max_entries) {
            result.stage = static_cast<int64_t>(j);
            result.max_entries = static_cast<int64_t>(next.size());
            return OALLAMA_PARETO_TOO_LARGE;
        }
        result.max_entries = std::max<int64_t>(result.max_entries, static_cast<int64_t>(next.size()));
        hist[j].reserve(next.size());
        for (const entry & x : next) {
            hist[j].emplace_back(x.parent, x.edge);
        }
        cur.swap(next);
    }
    size_t best = 0;
    for (size_t i = 1; i < cur.size(); ++i) {
        if (cur[i].t < cur[best].t) {
            best = i;
        }
    }
    result.t = cur[best].t;
    result.b = cur[best].b;
    result.edges.assign(stages.size(), -1);
    int64_t e = static_cast<int64_t>(best);
    for (size_t j = stages.size(); j-- > 0;) {
        result.edges[j] = hist[j][e].second;
        e = hist[j][e].first;
    }
    return OALLAMA_PARETO_OK;
}

void oallama_pareto_bounds(const std::vector<oallama_pareto_stage> & stages, int64_t n_lambda, const double * lambdas,
                           int64_t n_level, const int64_t * levels, std::vector<std::vector<double>> & rest) {
    // backwards: rest[j][(l * n_lambda + k) * states_j + s] = least over s's edges e streaming no more than
    // level l of dt + lambda_k * db + rest[j + 1][l, k, dst]
    const size_t n = stages.size();
    const int64_t n_lv = std::max<int64_t>(n_level, 1);
    rest.assign(n + 1, {});
    rest[n].assign(static_cast<size_t>(n_lv * n_lambda * (n ? stages[n - 1].n_next : 1)), 0.0);
    for (size_t j = n; j-- > 0;) {
        const oallama_pareto_stage & s = stages[j];
        const std::vector<double> & after = rest[j + 1];
        std::vector<double> & here = rest[j];
        here.assign(static_cast<size_t>(n_lv * n_lambda * s.n_states), INFINITY);
        for (int64_t l = 0; l < n_lv; ++l) {
            for (int64_t e = 0; e < s.n_edges; ++e) {
                if (n_level > 0 && s.sw[e] > levels[l]) {
                    continue;
                }
                for (int64_t k = 0; k < n_lambda; ++k) {
                    const int64_t row = l * n_lambda + k;
                    const double v = s.dt[e] + lambdas[k] * static_cast<double>(s.db[e]) +
                                     after[row * s.n_next + s.dst[e]];
                    double & slot = here[row * s.n_states + s.src[e]];
                    slot = std::min(slot, v);
                }
            }
        }
    }
}
