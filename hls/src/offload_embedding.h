// Embedding lookup with bag pooling (table-batched, FBGEMM TBE layout): the generic HLS body.
//
// A generated kernel (offload.hls.embedding) writes a config header with one struct per table
// (K::tN: storage/value types, dim, rows, padding, read()) and one kernel struct K (acc_t, out_t,
// weight_t, mode, total_dim), then calls offload_emb::pool_table<K, K::tN>() per table from its
// extern "C" top function. The arithmetic is exactly offload.sim.embedding's:
//   term = acc_t(e) or acc_t(e * w)         (exact product, cast with acc_t's rounding/overflow)
//   sum : acc = acc + term                  (assignment applies acc_t's overflow mode each step)
//   mean: raw(acc) -> sign * ((2|a| + n) / (2n))   (round half away from zero), 0 if n == 0
//   max : largest term; 0 for an empty bag
//   out = out_t(pooled)
// Entries equal to the table's padding index are skipped (not counted for mean).
// Partial output (pool_table_partial, a row-wise shard of a table): out is the raw accumulator
// (no mean division, no output cast) and count[b * num_tables + table_no] the bag's entries, so
// the host combines shards exactly and rounds once.
// Compiles with plain g++ (HLS pragmas are ignored there) against the ap_types headers.
#ifndef OFFLOAD_EMBEDDING_H
#define OFFLOAD_EMBEDDING_H

#include <stdint.h>

#include "ap_fixed.h"
#include "ap_int.h"

// The generated config defines it before including this header (a pragma needs a literal).
#ifndef OFFLOAD_EMB_MAX_BAG
#define OFFLOAD_EMB_MAX_BAG 256
#endif

namespace offload_emb {

enum Mode { MODE_SUM = 0, MODE_MEAN = 1, MODE_MAX = 2 };

// Raw bits <-> ap_fixed, without any rounding: the ABI carries raw integers only.
template <class FX>
inline FX from_raw(int64_t v) {
    FX x;
    x.range() = ap_int<FX::width>(v);
    return x;
}

template <class FX, bool S>
inline int64_t to_raw(const FX &x) {
    ap_int_base<FX::width, S> r;
    r.range() = x.range();
    return r.to_int64();
}

// round(a / n), ties away from zero, on the raw accumulator; |a| < 2^61 so 2|a| + n fits.
inline int64_t round_div(int64_t a, int64_t n) {
    if (n == 0) return 0;
    const int64_t m = a < 0 ? -a : a;
    const int64_t q = (2 * m + n) / (2 * n);
    return a < 0 ? -q : q;
}

template <class K, class T, bool PARTIAL>
void pool_table_impl(const typename T::store_t *table, const typename T::pstore_t *params,
                     const int64_t *indices, const int64_t *offsets, const typename K::wstore_t *weights,
                     typename K::ostore_t *out, int64_t *count, int num_bags, int table_no, int num_tables, int weighted) {
    typedef typename K::acc_t acc_t;
    typedef typename K::out_t out_t;
    acc_t acc[T::dim];
#pragma HLS ARRAY_PARTITION variable = acc cyclic factor = 4
    typename K::ostore_t row_out[T::dim];
BAGS:
    for (int b = 0; b < num_bags; b++) {
        const int64_t start = offsets[(int64_t)table_no * num_bags + b];
        const int64_t end = offsets[(int64_t)table_no * num_bags + b + 1];
        int64_t n = 0;
    INIT:
        for (int d = 0; d < T::dim; d++) {
#pragma HLS PIPELINE II = 1
            acc[d] = 0;
        }
    ENTRIES:
        for (int64_t k = start; k < end; k++) {
#pragma HLS LOOP_TRIPCOUNT min = 0 max = OFFLOAD_EMB_MAX_BAG
            const int64_t row = indices[k];
            if (T::has_padding && row == T::padding) continue;
            const typename K::weight_t w = from_raw<typename K::weight_t>(weighted ? (int64_t)weights[k] : 0);
            typename T::param_t scale, bias;
            T::load_params(params, row, scale, bias);
        ELEMS:
            for (int d = 0; d < T::dim; d++) {
#pragma HLS PIPELINE II = 1
                const typename T::value_t e = T::read(table, row, d, scale, bias);
                const acc_t term = weighted ? acc_t(e * w) : acc_t(e);
                if (K::mode == MODE_MAX) {
                    if (n == 0 || term > acc[d]) acc[d] = term;
                } else {
                    acc[d] = acc[d] + term;
                }
            }
            n++;
        }
    FINISH:
        for (int d = 0; d < T::dim; d++) {
#pragma HLS PIPELINE II = 1
            acc_t r = acc[d];
            if (PARTIAL) {
                row_out[d] = (typename K::ostore_t)to_raw<acc_t, true>(r);
            } else {
                if (K::mode == MODE_MEAN) r = from_raw<acc_t>(round_div(to_raw<acc_t, true>(acc[d]), n));
                row_out[d] = (typename K::ostore_t)to_raw<out_t, K::out_signed>(out_t(r));
            }
        }
    // One burst per pooled row.
    WRITE:
        for (int d = 0; d < T::dim; d++) {
#pragma HLS PIPELINE II = 1
            out[(int64_t)b * K::total_dim + T::col + d] = row_out[d];
        }
        if (PARTIAL) count[(int64_t)b * num_tables + table_no] = n;
    }
}

template <class K, class T>
void pool_table(const typename T::store_t *table, const typename T::pstore_t *params,
                const int64_t *indices, const int64_t *offsets, const typename K::wstore_t *weights,
                typename K::ostore_t *out, int num_bags, int table_no, int weighted) {
    pool_table_impl<K, T, false>(table, params, indices, offsets, weights, out, (int64_t *)0, num_bags, table_no, 1, weighted);
}

template <class K, class T>
void pool_table_partial(const typename T::store_t *table, const typename T::pstore_t *params,
                        const int64_t *indices, const int64_t *offsets, const typename K::wstore_t *weights,
                        typename K::ostore_t *out, int64_t *count, int num_bags, int table_no, int num_tables, int weighted) {
    pool_table_impl<K, T, true>(table, params, indices, offsets, weights, out, count, num_bags, table_no, num_tables, weighted);
}

}  // namespace offload_emb

#endif
