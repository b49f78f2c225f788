// Attention over a KV cache (decode, speculative decoding, chunked prefill): split-KV on mma.sync, sm_80+.
//
// lse may be null (the caller asked for no LSE): nothing is written there.
//
// Layout: q [batch, seq_q, heads, HEAD_DIM] (any strides on the first three dimensions, multiples of 8
// elements); the cache either contiguous, k/v [batch, max_seq, kv_heads, HEAD_DIM] (s_b = batch stride), or
// paged, k/v [num_pages, page, kv_heads, HEAD_DIM] with block_table int32 [batch, max_pages] (s_b = page stride):
// key position j of sequence b lives in page block_table[b][j / page], slot j % page. The sequence holds
// L_b = cache_seqlens[b] + seqlen_new keys (new tokens appended by kv_append first).
//
// GQA packing: the seq_q x group query rows that share a KV head are rows of one 16-row tile (row r = query
// position r / group, head kv_head * group + r % group), so each K/V tile is read once per group. More rows
// than 16 take several row tiles (grid.y = kv_heads x row tiles).
//
// Split-KV: grid.x = num_splits; split s covers keys [s * split_keys, (s + 1) * split_keys) of each sequence
// (clipped to L_b and to the causal/window bounds of its rows). Block: WARPS warps; a stage of the cp.async ring
// holds WARPS x 16 keys and warp w takes keys [16 w, 16 w + 16) of each stage: its own S = Q K^T (m16n8k16),
// online softmax and O += P V over its share of the split. At the end the warps' (max, sum, O) are merged
// through shared memory. With one split the result is O and LSE; with several, each split writes its O
// (normalised, fp32) and LSE to o_part / lse_part, and the last split of a (batch, kv head, row tile) to finish
// (a counter per tile, which that split sets back to zero for the next launch) merges them by LSE: no second
// kernel and no memset before the launch. On sm_90, 2, 4 or 8 splits of at most a few thousand keys run as
// flash_decode_cluster instead: the splits of a tile are one thread block cluster and merge their rows through
// distributed shared memory (decode_body's CLUSTER), which takes the global round trips off a short call's tail.
//
// Paged reads: a stage's keys are copied in groups of 16 that start on a multiple of 16 (pages hold a multiple
// of 16 keys, so a group lies in one page); each group's page is looked up once, a block of STAGES stages at a
// time (one thread per group, every STAGES stages), at least a stage before its copies are issued, from page ids
// read a block before that (their readers never wait for them), and the groups' K and V offsets are left in
// (static) shared memory. The copying threads add a row offset to those: no table read or division by the page
// size per 16-byte chunk.
//
// WARP_PIPE (decode_configs.use_warp_pipe): warp w reads only keys [16 w, 16 w + 16) of each stage, so it may copy
// just those rows itself: then a stage waits on the warp's own copies and a warp barrier, not on the CTA, and a paged
// warp holds its group's page ids in its lanes (lane l: stage 32 blk + l of the split, the next block's ids read as
// the block before starts), broadcast by a shuffle when the stage is copied: no offsets in shared memory and no
// lookups holding a CTA barrier. Q is still copied by the whole CTA, with one CTA barrier before the loop.
//
// Masks, per row: keys j < L_b; causal/window in kv coordinates (query i sits at L_b - seq_q + i):
// j in [at - window_left, at + window_right] (window_right = 0 under causal; unbounded = a large value).
//
// PAIR (head dim 64 with adjacent KV heads, run as HEAD_DIM = 128): KV heads 2p and 2p + 1 are read as one
// 128-wide row (256 contiguous bytes per key instead of two 128-byte pieces that other CTAs fetch at other
// times). The tile's rows are both heads' query rows (kv_group = 2 x the real group; a row's half = which of the
// two heads it attends with), each row's Q sits in its half of the 128 columns with zeros in the other, so
// S = Q K^T is its own head's product; O = P V is computed 128 wide and each row keeps its own half. q and o
// are [batch, seq_q, heads, 64]; the caller passes the K/V strides of the pair (2 x the head stride).
#include "common.cuh"
#include "tma.cuh"  // clusters: rank, barrier, distributed shared memory loads
#include "pdl.cuh"

using namespace attn;

// ATTN_DECODE_TIMELINE=N (a probe, never defined in the engine's builds, whose SASS it leaves untouched): thread 0
// of each of the first N CTAs (x fastest, then y, z) writes stamps into attn_decode_timeline[cta][slot] (the host
// zeroes it first): 0 the global timer (ns) at entry, 7 at exit (a cluster's CTAs); 1-6 clock64 at: 1 past
// pdl::enter, 2 the first stages' copies issued (paged: after the page offsets' barrier), 3 stage 0 landed (past
// its wait and barrier), 4 the loop done, 5 the warps merged, 6 exit (a cluster's CTAs).
// docs/results/h100/stop64/decode_paged/decode_tl.py reads them.
#ifdef ATTN_DECODE_TIMELINE
#include "timeline.cuh"
__device__ unsigned long long attn_decode_timeline[ATTN_DECODE_TIMELINE][8];
#define ADT_STAMP(slot, value)                                                                                   \
    do {                                                                                                         \
        const unsigned cta_ = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);                    \
        if (threadIdx.x == 0 && cta_ < ATTN_DECODE_TIMELINE) attn_decode_timeline[cta_][slot] = (value);         \
    } while (0)
#define ADT_CLOCK() ((unsigned long long)clock64())
#define ADT_NOW() global_timer_ns()
#else
#define ADT_STAMP(slot, value) \
    do {                       \
    } while (0)
#endif

// A page id as read from the block table, clamped to [0, num_pages) (the host checks the table; this keeps a bad
// one in bounds).
__device__ __forceinline__ int clamp_page(int raw, int num_pages) { return min(max(raw, 0), num_pages - 1); }

// Where key j of sequence b lives: (page or batch index, row within it).
template <bool PAGED>
__device__ __forceinline__ int2 kv_row(int j, int b, const int* __restrict__ block_table, int max_pages, int page,
                                       int num_pages) {
    if constexpr (PAGED) {
        return make_int2(clamp_page(__ldg(block_table + (long long)b * max_pages + j / page), num_pages), j % page);
    } else {
        return make_int2(b, j);
    }
}

__device__ __forceinline__ long long row_offset(int2 at, long long s_b, long long s_s) {
    return at.x * s_b + (long long)at.y * s_s;
}

#define DECODE_PARAMS                                                                                                \
    const T *__restrict__ q, const T *__restrict__ k, const T *__restrict__ v, T *__restrict__ o,                    \
        float *__restrict__ lse, float *__restrict__ o_part, float *__restrict__ lse_part, int *__restrict__ counters, \
        const int *__restrict__ cache_seqlens, const int *__restrict__ block_table, long long q_sb, long long q_ss,   \
        long long q_sh, long long k_sb, long long k_ss, long long k_sh, long long v_sb, long long v_ss,              \
        long long v_sh, int seq_q, int heads, int kv_heads, int kv_group, int max_pages, int page, int num_pages,    \
        int capacity, int seqlen_new, int window_left, int window_right, int split_keys, float scale_log2
#define DECODE_ARGS                                                                                                   \
    q, k, v, o, lse, o_part, lse_part, counters, cache_seqlens, block_table, q_sb, q_ss, q_sh, k_sb, k_ss, k_sh,     \
        v_sb, v_ss, v_sh, seq_q, heads, kv_heads, kv_group, max_pages, page, num_pages, capacity, seqlen_new,         \
        window_left, window_right, split_keys, scale_log2

// CLUSTER > 1 (sm_90, flash_decode_cluster): the CLUSTER splits of a (batch, kv head, row tile) are one thread
// block cluster (grid.x = CLUSTER). Each CTA leaves its rows' normalised O (fp32) and LSE in its own shared memory;
// after a cluster barrier the CTAs merge the rows by LSE between them, reading the others' shared memory
// (distributed shared memory), and meet again before exiting: no partials in global memory, no fence, no counter.
template <typename T, int HEAD_DIM, int WARPS, int STAGES, bool PAGED, bool PAIR, int CLUSTER, bool WARP_PIPE>
__device__ __forceinline__ void decode_body(DECODE_PARAMS) {
    constexpr int THREADS = WARPS * 32;
    constexpr int KEYS = WARPS * 16;      // keys per stage
    constexpr int CHUNKS = HEAD_DIM / 8;  // 16-byte chunks per row
    constexpr int DT = HEAD_DIM / 8;
    constexpr int KSTEPS = HEAD_DIM / 16;
    constexpr bool Q_IN_REGS = HEAD_DIM <= 128;
    constexpr int ROW_BYTES = HEAD_DIM * 2;
    constexpr int OUT_DIM = PAIR ? HEAD_DIM / 2 : HEAD_DIM;  // q and o columns per head
    static_assert(!PAIR || HEAD_DIM == 128, "pairs are two head-dim-64 heads");
    static_assert((KEYS * CHUNKS) % THREADS == 0, "copy split");
    static_assert(WARPS * 16 * (HEAD_DIM + 6) * 4 <= 2 * STAGES * KEYS * ROW_BYTES, "the merge fits the ring");
    static_assert(16 * 128 * 4 <= 2 * STAGES * KEYS * ROW_BYTES, "the split weights (<= 128 splits) fit the ring");
    static_assert(CLUSTER == 1 || (WARPS * 16 * (HEAD_DIM + 6) + 16 * HEAD_DIM + 16) * 4 <= 2 * STAGES * KEYS * ROW_BYTES,
                  "the cluster's rows fit the ring beside the merge");

    extern __shared__ __align__(128) unsigned char smem_raw[];
    T* sQ = reinterpret_cast<T*>(smem_raw);
    T* sK = sQ + 16 * HEAD_DIM;
    T* sV = sK + STAGES * KEYS * HEAD_DIM;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int split = blockIdx.x, kvh = blockIdx.y % kv_heads, row_tile = blockIdx.y / kv_heads, b = blockIdx.z;
    const int rows = seq_q * kv_group;
    const int r0 = row_tile * 16;
    ADT_STAMP(0, ADT_NOW());
    // launched as a programmatic dependent (sm_90): nothing global is read or written before the grid before it
    // (kv_append, or the kernel that made q) has finished; the next kernel may be scheduled from here on
    pdl::enter();
    ADT_STAMP(1, ADT_CLOCK());
    // Paged: the block-table reads of the first STAGES stages' groups (and stage STAGES's) go out before the
    // sequence length is known, from where the split starts when no window moves it (split_keys is a multiple of
    // 16): the table and the length then cost one trip to memory, not two. Entries past the sequence are read
    // and not used (capacity = max_pages x page keeps every read inside the table's row).
    const int split_begin = split * split_keys;
    const int* table_row = block_table + (long long)b * max_pages;
    // j / page for a group's first key j (a multiple of 16): (j / 16) / (page / 16) as a multiply-high by a
    // reciprocal taken once here, not a division (~20 dependent instructions) per lookup on warp 0's way to its
    // copies. With d = page / 16 <= 16, m = floor((2^32 - 1) / d) + 1 = ceil(2^32 / d) errs by e = m d - 2^32 < d,
    // so umulhi(n, m) = floor(n / d + n e / (d 2^32)) is exact while n e < 2^32 (n = j / 16 < 2^27). d = 1 (pages
    // of 16) overflows m: the quotient is n.
    const unsigned page_d = (unsigned)page >> 4, page_m = 0xffffffffu / max(page_d, 1u) + 1u;
    auto page_index = [&](int j) {
        const unsigned n = (unsigned)j >> 4;
        return (int)(page_d == 1u ? n : __umulhi(n, page_m));
    };
    // the page id of key j as read (clamped where it is used, so its reader never waits on it early); 0 from
    // `bound` on
    auto page_at = [&](int j, int bound) {
        int raw = 0;
        if (j < bound) raw = __ldg(table_row + page_index(j));
        return raw;
    };
    // Threads 0..STAGES x WARPS - 1 each keep one group of a block of STAGES stages: first_pid its page id in the
    // first block, next_pid in the block after the one whose offsets are stored next
    int first_pid = 0, next_pid = 0;
    // WARP_PIPE: lane l of warp w holds the page id of warp w's group in stage 32 blk + l (w_ids), and of the
    // block after (w_ids_next, read when the block before is entered)
    int w_ids = 0, w_ids_next = 0, w_blk = 0;
    if constexpr (PAGED && WARP_PIPE) {
        w_ids = page_at(split_begin + lane * KEYS + warp * 16, capacity);
    } else if constexpr (PAGED) {
        if (tid < STAGES * WARPS) {
            first_pid = page_at(split_begin + (tid / WARPS) * KEYS + (tid % WARPS) * 16, capacity);
            next_pid = page_at(split_begin + (STAGES + tid / WARPS) * KEYS + (tid % WARPS) * 16, capacity);
        }
    }
    const T* kb = k + kvh * k_sh;
    const T* vb = v + kvh * v_sh;

    auto load_q = [&]() {
        for (int i = tid; i < 16 * CHUNKS; i += THREADS) {
            const int r = i / CHUNKS, ch = i % CHUNKS;
            const int gr = r0 + r;
            bool ok = gr < rows;
            const int qi = ok ? gr / kv_group : 0, within = ok ? gr % kv_group : 0, head = kvh * kv_group + within;
            int col = ch * 8;
            if constexpr (PAIR) {  // the row's own half of the 128 columns; zeros in the other
                const int half = within / (kv_group / 2);
                ok = ok && ch / (CHUNKS / 2) == half;
                col = (ch % (CHUNKS / 2)) * 8;
            }
            const T* from = q + b * q_sb + qi * q_ss + head * q_sh + col;
            cp_async16(smem_addr(sQ + swizzled<HEAD_DIM>(r, ch)), from, ok);
        }
    };
    // the Q tile does not depend on the sequence length: its copies go out before the length is read
    load_q();
    cp_async_commit();
    // Contiguous cache with no window start (window_left >= capacity: k_begin is then split_begin whatever the
    // length): the first K/V stage's copies go out before the length is read too, bounded by the split and the
    // cache instead of the sequence (its rows past the sequence are zeroed once they land, below), so the length
    // and the first keys cost one trip to memory, not two.
    const int split_end = min((split + 1) * split_keys, capacity);
    const bool early_kv = !PAGED && window_left >= capacity;
    // Paged: the K and V offsets of each 16-key group of a stage, looked up once per group (not per 16-byte
    // chunk), a block of STAGES stages at a time, into a ring of two blocks: every STAGES iterations threads
    // 0..STAGES x WARPS - 1 (one group each) store the offsets of the block after the one being copied, from page
    // ids read a block earlier, and read the ids of the block after that. So no copy waits on the block table, no
    // thread divides by the page size per chunk, and the lookups hold up the stage barrier once per STAGES stages
    // (one stage at a time, by WARPS lanes every stage, measured 2-5 % slower at B1-B8 L1k and with the 4 x 4
    // ring at B1; docs/perf/attention.md, decode eighth pass).
    constexpr int OFF_RING = 2 * STAGES;
    __shared__ long long s_off[PAGED && !WARP_PIPE ? OFF_RING : 1][PAGED && !WARP_PIPE ? 2 * WARPS : 1];
    auto load_kv = [&](int stage_idx, int ring, int j0, int bound) {
        if constexpr (WARP_PIPE) {  // this warp's 16 rows: 16 x CHUNKS chunks of K and of V over its 32 lanes
            long long kgrp = 0, vgrp = 0;
            const int jg = j0 + warp * 16;  // the group's first key
            if constexpr (PAGED) {
                if ((stage_idx >> 5) != w_blk) {  // entering the next block of 32 stages (stage_idx % 32 == 0 here)
                    w_ids = w_ids_next;
                    w_blk = stage_idx >> 5;
                    w_ids_next = page_at(jg + (32 - (stage_idx & 31)) * KEYS + lane * KEYS, capacity);
                }
                const int pid = clamp_page(__shfl_sync(0xffffffffu, w_ids, stage_idx & 31), num_pages);
                const long long slot = jg - page_index(jg) * page;
                kgrp = pid * k_sb + slot * k_ss;
                vgrp = pid * v_sb + slot * v_ss;
            }
#pragma unroll
            for (int it = 0; it < 16 * CHUNKS / 32; ++it) {
                const int i = it * 32 + lane;
                const int r = i / CHUNKS, ch = i % CHUNKS, row = warp * 16 + r;
                const int j = jg + r;
                const bool ok = j < bound;
                long long off, voff;
                if constexpr (PAGED) {
                    off = kgrp + r * k_ss;
                    voff = vgrp + r * v_ss;
                } else {
                    const int2 at = make_int2(b, ok ? j : 0);
                    off = row_offset(at, k_sb, k_ss), voff = row_offset(at, v_sb, v_ss);
                }
                cp_async16(smem_addr(sK + ring * KEYS * HEAD_DIM + swizzled<HEAD_DIM>(row, ch)), kb + off + ch * 8, ok);
                cp_async16(smem_addr(sV + ring * KEYS * HEAD_DIM + swizzled<HEAD_DIM>(row, ch)), vb + voff + ch * 8, ok);
            }
            return;
        }
#pragma unroll
        for (int it = 0; it < KEYS * CHUNKS / THREADS; ++it) {
            const int i = it * THREADS + tid;
            const int row = i / CHUNKS, ch = i % CHUNKS;
            const int j = j0 + row;
            const bool ok = j < bound;
            long long off, voff;
            if constexpr (PAGED) {
                const long long* from = s_off[stage_idx % OFF_RING];
                const long long r = row & 15;
                off = from[row >> 4] + r * k_ss;
                voff = from[WARPS + (row >> 4)] + r * v_ss;
            } else {
                const int2 at = make_int2(b, ok ? j : 0);
                off = row_offset(at, k_sb, k_ss), voff = row_offset(at, v_sb, v_ss);
            }
            cp_async16(smem_addr(sK + ring * KEYS * HEAD_DIM + swizzled<HEAD_DIM>(row, ch)), kb + off + ch * 8, ok);
            cp_async16(smem_addr(sV + ring * KEYS * HEAD_DIM + swizzled<HEAD_DIM>(row, ch)), vb + voff + ch * 8, ok);
        }
    };

    if (early_kv) load_kv(0, 0, split_begin, split_end);  // stage 0 into ring slot 0, bounded by the split
    const int len = min(__ldg(cache_seqlens + b) + seqlen_new, capacity);  // clamped: never past the cache
    const int shift = len - seq_q;                                         // query i sits at key i + shift

    // keys this CTA reads: its split, clipped to the sequence and to what its rows can see
    const int first_q = r0 / kv_group, last_q = min(r0 + 15, rows - 1) / kv_group;
    int k_begin = max(split_begin, first_q + shift - window_left);
    int k_end = min(min(len, (split + 1) * split_keys), last_q + shift + window_right + 1);
    k_begin = max(k_begin, 0);
    // a paged cache is read in groups of 16 keys that start on a multiple of 16, so a group never straddles a
    // page (pages hold a multiple of 16 keys); the keys moved in below a window's start are masked by lo[]
    if constexpr (PAGED) k_begin &= ~15;
    const int n_stages = k_end > k_begin ? (k_end - k_begin + KEYS - 1) / KEYS : 0;

    // o's column for the kernel's column c of packed row gr, or -1 where the row keeps nothing (PAIR)
    auto out_col = [&](int gr, int c) {
        if constexpr (PAIR) {
            const int half = (gr % kv_group) / (kv_group / 2);
            return c / OUT_DIM == half ? c - half * OUT_DIM : -1;
        } else {
            return c;
        }
    };
    auto store_offsets = [&](int stage_idx, int grp, int raw_pid) {
        const int j = k_begin + stage_idx * KEYS + grp * 16;
        const long long slot = j - page_index(j) * page;
        const int pid = clamp_page(raw_pid, num_pages);
        long long* to = s_off[stage_idx % OFF_RING];
        to[grp] = pid * k_sb + slot * k_ss;
        to[WARPS + grp] = pid * v_sb + slot * v_ss;
    };
    auto group_page = [&](int stage_idx, int grp) {  // the page id of a group, 0 past the split's keys
        return page_at(k_begin + stage_idx * KEYS + grp * 16, k_end);
    };
    if constexpr (PAGED) {
        // the first block's offsets (a window that moved the start reads its groups again), the second block's
        // page ids into registers
        if constexpr (WARP_PIPE) {
            if (k_begin != split_begin) w_ids = page_at(k_begin + lane * KEYS + warp * 16, capacity);
            if (n_stages > 32) w_ids_next = page_at(k_begin + (32 + lane) * KEYS + warp * 16, capacity);
        } else {
            if (k_begin != split_begin) {  // the same for the whole CTA
                if (tid < STAGES * WARPS) {
                    first_pid = group_page(tid / WARPS, tid % WARPS);
                    next_pid = group_page(STAGES + tid / WARPS, tid % WARPS);
                }
            }
            if (tid < STAGES * WARPS) store_offsets(tid / WARPS, tid % WARPS, first_pid);
            __syncthreads();
        }
    }
    int next_load = 0, load_ring = 0;
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (next_load < n_stages && !(early_kv && next_load == 0))  // (stage 0 went out early)
            load_kv(next_load, load_ring, k_begin + next_load * KEYS, k_end);
        if (next_load < n_stages) ++next_load;
        cp_async_commit();
        load_ring = load_ring + 1 == STAGES ? 0 : load_ring + 1;
    }
    ADT_STAMP(2, ADT_CLOCK());

    // ldmatrix addresses (common.cuh); warp w's keys start 16 w rows into each stage
    unsigned q_off[4], k_off[4], v_off[4];
    ldmatrix_lane_offsets<HEAD_DIM>(sQ, 0, sK, sV, warp * 16, lane, q_off, k_off, v_off);
    auto q_addr = [&](int kk) { return q_off[kk & 3] + (kk >> 2) * 128; };
    unsigned qf[Q_IN_REGS ? KSTEPS : 1][4];
    if constexpr (Q_IN_REGS) {
        cp_async_wait<STAGES - 1>();
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < KSTEPS; ++kk) ldmatrix_x4(q_addr(kk), qf[kk][0], qf[kk][1], qf[kk][2], qf[kk][3]);
    } else if constexpr (WARP_PIPE) {  // Q read from shared memory in the loop, whose barriers are the warp's own
        cp_async_wait<STAGES - 1>();
        __syncthreads();
    }

    // rows g and g + 8 of the tile: the keys each may see
    int lo[2], hi[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int gr = r0 + g + 8 * h;
        const int at = (gr < rows ? gr / kv_group : 0) + shift;
        lo[h] = gr < rows ? at - window_left : 1;  // an empty range for padding rows
        hi[h] = gr < rows ? min(at + window_right, k_end - 1) : 0;
    }

    float o_acc[DT][4];
    float row_max[2] = {neg_inf(), neg_inf()}, row_sum[2] = {0.f, 0.f};
#pragma unroll
    for (int i = 0; i < DT; ++i) o_acc[i][0] = o_acc[i][1] = o_acc[i][2] = o_acc[i][3] = 0.f;

    for (int st = 0; st < n_stages; ++st) {
        const int ring = st % STAGES;
        cp_async_wait<STAGES - 2>();
        if (early_kv && st == 0 && k_end < split_begin + KEYS) {  // the early stage's rows past the keys: zeros, as
            // the copies bounded by k_end would have left them (this thread's own copies, landed with the wait)
#pragma unroll
            for (int it = 0; it < KEYS * CHUNKS / THREADS; ++it) {
                const int i = WARP_PIPE ? it * 32 + lane : it * THREADS + tid;
                const int row = WARP_PIPE ? warp * 16 + i / CHUNKS : i / CHUNKS, ch = i % CHUNKS;
                if (split_begin + row >= k_end) {
                    const uint4 z = make_uint4(0, 0, 0, 0);
                    *reinterpret_cast<uint4*>(sK + swizzled<HEAD_DIM>(row, ch)) = z;
                    *reinterpret_cast<uint4*>(sV + swizzled<HEAD_DIM>(row, ch)) = z;
                }
            }
        }
        if constexpr (WARP_PIPE) {
            __syncwarp();
        } else {
            __syncthreads();
        }
        if (st == 0) ADT_STAMP(3, ADT_CLOCK());
        if constexpr (PAGED && !WARP_PIPE) {
            if (st % STAGES == 0 && tid < STAGES * WARPS) {  // stages st + STAGES .. st + 2 STAGES - 1's offsets
                // (copied from the next iteration on; their slots' last reader copied at iteration st - STAGES),
                // then the page ids of the block after
                store_offsets(st + STAGES + tid / WARPS, tid % WARPS, next_pid);
                next_pid = group_page(st + 2 * STAGES + tid / WARPS, tid % WARPS);
            }
        }
        if (next_load < n_stages) {
            load_kv(next_load, load_ring, k_begin + next_load * KEYS, k_end);
            ++next_load;
        }
        cp_async_commit();
        load_ring = load_ring + 1 == STAGES ? 0 : load_ring + 1;

        const unsigned stage_bytes = ring * (KEYS * ROW_BYTES);
        const int j0 = k_begin + st * KEYS + warp * 16;
        float s[2][4];
#pragma unroll
        for (int i = 0; i < 2; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < KSTEPS; ++kk) {
            unsigned a[4];
            if constexpr (Q_IN_REGS) {
                a[0] = qf[kk][0]; a[1] = qf[kk][1]; a[2] = qf[kk][2]; a[3] = qf[kk][3];
            } else {
                ldmatrix_x4(q_addr(kk), a[0], a[1], a[2], a[3]);
            }
            unsigned b0, b1, b2, b3;
            ldmatrix_x4(k_off[kk & 3] + stage_bytes + (kk >> 2) * 128, b0, b1, b2, b3);
            mma16816<T>(s[0], a, b0, b1);
            mma16816<T>(s[1], a, b2, b3);
        }
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int j = j0 + nt * 8 + 2 * t + (e & 1), h = e >> 1;
                if (j < lo[h] || j > hi[h]) s[nt][e] = neg_inf();
            }
        online_softmax<2, DT, true>(s, o_acc, row_max, row_sum, scale_log2);
        unsigned a[4];
        pack_a_fragment<T>(s[0], s[1], a);
#pragma unroll
        for (int dp = 0; dp < DT / 2; ++dp) {
            unsigned b0, b1, b2, b3;
            ldmatrix_x4_trans(v_off[dp & 3] + stage_bytes + (dp >> 2) * 128, b0, b1, b2, b3);
            mma16816<T>(o_acc[2 * dp], a, b0, b1);
            mma16816<T>(o_acc[2 * dp + 1], a, b2, b3);
        }
    }
    cp_async_wait<0>();
    __syncthreads();
    ADT_STAMP(4, ADT_CLOCK());

    // ---- merge the warps: (max in log2 units, sum, O) per row through shared memory (the K/V ring's space)
    float* sM = reinterpret_cast<float*>(sK);  // [WARPS][16]
    float* sL = sM + WARPS * 16;               // [WARPS][16]
    float* sO = sL + WARPS * 16;               // [WARPS][16][HEAD_DIM + 4]
    constexpr int OS = HEAD_DIM + 4;
    float* sCO = sO + WARPS * 16 * OS;  // CLUSTER > 1: [16][HEAD_DIM] this CTA's rows, normalised
    float* sCL = sCO + 16 * HEAD_DIM;    // CLUSTER > 1: [16] their LSE
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const float l = quad_sum(row_sum[h]);
        const int r = g + 8 * h;
        if (t == 0) {
            sM[warp * 16 + r] = row_max[h] == neg_inf() ? neg_inf() : row_max[h] * scale_log2;
            sL[warp * 16 + r] = l;
        }
#pragma unroll
        for (int dt = 0; dt < DT; ++dt) {
            sO[(warp * 16 + r) * OS + dt * 8 + 2 * t] = o_acc[dt][2 * h];
            sO[(warp * 16 + r) * OS + dt * 8 + 2 * t + 1] = o_acc[dt][2 * h + 1];
        }
    }
    __syncthreads();
    constexpr float LN2 = 0.6931471805599453f;
    for (int i = tid; i < 16 * (HEAD_DIM / 4); i += THREADS) {
        const int r = i / (HEAD_DIM / 4), c = (i % (HEAD_DIM / 4)) * 4;
        const int gr = r0 + r;
        if (gr >= rows) continue;
        float m = neg_inf();
#pragma unroll
        for (int w = 0; w < WARPS; ++w) m = fmaxf(m, sM[w * 16 + r]);
        float l = 0.f, acc[4] = {0.f, 0.f, 0.f, 0.f};
        if (m != neg_inf()) {
#pragma unroll
            for (int w = 0; w < WARPS; ++w) {
                const float f = exp2f(sM[w * 16 + r] - m);
                l = fmaf(sL[w * 16 + r], f, l);
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[e] = fmaf(sO[(w * 16 + r) * OS + c + e], f, acc[e]);
            }
        }
        const float inv = l > 0.f ? 1.f / l : 0.f;
        const int qi = gr / kv_group, head = kvh * kv_group + gr % kv_group;
        const float row_lse = l > 0.f ? (m + log2f(l)) * LN2 : neg_inf();
        if constexpr (CLUSTER > 1) {  // the row stays in this CTA's shared memory for the cluster's merge
            *reinterpret_cast<float4*>(sCO + r * HEAD_DIM + c) =
                make_float4(acc[0] * inv, acc[1] * inv, acc[2] * inv, acc[3] * inv);
            if (c == 0) sCL[r] = row_lse;
        } else if (o_part == nullptr) {
            const int oc = out_col(gr, c);
            if (oc < 0) continue;
            T* dst = o + (((long long)b * seq_q + qi) * heads + head) * OUT_DIM + oc;
            *reinterpret_cast<uint2*>(dst) = make_uint2(pack2<T>(acc[0] * inv, acc[1] * inv),
                                                        pack2<T>(acc[2] * inv, acc[3] * inv));
            if (oc == 0 && lse != nullptr) lse[((long long)b * heads + head) * seq_q + qi] = row_lse;
        } else {
            const long long row = (((long long)split * gridDim.z + b) * seq_q + qi) * heads + head;
            *reinterpret_cast<float4*>(o_part + row * HEAD_DIM + c) =
                make_float4(acc[0] * inv, acc[1] * inv, acc[2] * inv, acc[3] * inv);
            if (c == 0) lse_part[row] = row_lse;
        }
    }
    ADT_STAMP(5, ADT_CLOCK());
    if constexpr (CLUSTER > 1) {
        // Every CTA of the cluster takes every CLUSTER-th (row, 4 columns) item: the CLUSTER LSEs and partial O
        // of its row read from the CTAs' shared memory (all loads of an item in flight together), weights
        // exp(lse_s - lse), the sum written; the LSE by the item of column 0.
        tma::cluster_sync();  // every CTA's rows are in its shared memory
        constexpr int C4 = HEAD_DIM / 4;
        const int live = min(16, rows - r0);
        const unsigned rank = tma::cluster_rank();
        const unsigned co_addr = tma::smem_u32(sCO), cl_addr = tma::smem_u32(sCL);
        for (int i = rank * THREADS + tid; i < live * C4; i += CLUSTER * THREADS) {
            const int r = i / C4, c = (i % C4) * 4, gr = r0 + r;
            const int oc = out_col(gr, c);
            if (oc < 0) continue;
            float ls[CLUSTER];
            float4 x[CLUSTER];
#pragma unroll
            for (int sp = 0; sp < CLUSTER; ++sp) {
                ls[sp] = tma::ld_cluster_f32(cl_addr + 4 * r, sp);
                x[sp] = tma::ld_cluster_f4(co_addr + 4 * (r * HEAD_DIM + c), sp);
            }
            float m = neg_inf();
#pragma unroll
            for (int sp = 0; sp < CLUSTER; ++sp) m = fmaxf(m, ls[sp]);
            float l = 0.f, acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
            for (int sp = 0; sp < CLUSTER; ++sp) {
                const float f = (m == neg_inf() || ls[sp] == neg_inf()) ? 0.f : __expf(ls[sp] - m);
                l += f;
                acc[0] = fmaf(x[sp].x, f, acc[0]), acc[1] = fmaf(x[sp].y, f, acc[1]);
                acc[2] = fmaf(x[sp].z, f, acc[2]), acc[3] = fmaf(x[sp].w, f, acc[3]);
            }
            const float inv = l > 0.f ? 1.f / l : 0.f;
            const int qi = gr / kv_group, head = kvh * kv_group + gr % kv_group;
            T* dst = o + (((long long)b * seq_q + qi) * heads + head) * OUT_DIM + oc;
            *reinterpret_cast<uint2*>(dst) = make_uint2(pack2<T>(acc[0] * inv, acc[1] * inv),
                                                        pack2<T>(acc[2] * inv, acc[3] * inv));
            if (oc == 0 && lse != nullptr)
                lse[((long long)b * heads + head) * seq_q + qi] = l > 0.f ? m + logf(l) : neg_inf();
        }
        tma::cluster_sync();  // no CTA leaves while another still reads its shared memory
        ADT_STAMP(6, ADT_CLOCK());
        ADT_STAMP(7, ADT_NOW());
        return;
    }
    if (o_part == nullptr) return;

    // ---- the last split of this (batch, kv head, row tile) to finish merges every split's rows by LSE
    __shared__ int s_last;
    __threadfence();  // this CTA's partials are visible device-wide before it is counted
    __syncthreads();
    int* counter = counters + (long long)b * gridDim.y + blockIdx.y;
    if (tid == 0) s_last = atomicAdd(counter, 1) == gridDim.x - 1;
    __syncthreads();
    if (!s_last) return;
    if (tid == 0) *counter = 0;  // every split has counted: the counter is ready for the next launch
    __threadfence();
    // Every L2 round trip here is on the call's critical path (one CTA, after all others), so the loads are
    // issued together: (1) every (row, split) LSE into shared memory at once; (2) per row (a warp, lanes over
    // splits) the weights exp(lse_s - lse) from there; (3) each thread's (row, 4 columns) items sum their splits'
    // O with all items' loads in flight together. Rows past the tile's real rows are not touched.
    const long long all_rows = (long long)gridDim.z * seq_q * heads;
    const int n_splits = gridDim.x;
    const int live = min(16, rows - r0);  // the tile's real rows
    float* sW = reinterpret_cast<float*>(sK);  // [16][n_splits]: LSE, then weights
    auto global_row = [&](int gr) {
        return ((long long)b * seq_q + gr / kv_group) * heads + kvh * kv_group + gr % kv_group;
    };
    const int pairs = live * n_splits;
    for (int base = 0; base < pairs; base += 4 * THREADS) {
        float x[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const int i = base + u * THREADS + tid;
            x[u] = i < pairs ? __ldcg(lse_part + (i % n_splits) * all_rows + global_row(r0 + i / n_splits)) : 0.f;
        }
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const int i = base + u * THREADS + tid;
            if (i < pairs) sW[i] = x[u];
        }
    }
    __syncthreads();
    for (int r = warp; r < live; r += WARPS) {
        float* w_row = sW + r * n_splits;
        float m = neg_inf();
        for (int sp = lane; sp < n_splits; sp += 32) m = fmaxf(m, w_row[sp]);
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
        float l = 0.f;
        for (int sp = lane; sp < n_splits; sp += 32) {  // each lane rewrites only its own entries
            const float ls = w_row[sp];
            const float f = (m == neg_inf() || ls == neg_inf()) ? 0.f : __expf(ls - m);
            w_row[sp] = f;
            l += f;
        }
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) l += __shfl_xor_sync(0xffffffffu, l, off);
        const float inv = l > 0.f ? 1.f / l : 0.f;
        for (int sp = lane; sp < n_splits; sp += 32) w_row[sp] *= inv;
        const int gr = r0 + r;
        if (lane == 0 && lse != nullptr)
            lse[((long long)b * heads + kvh * kv_group + gr % kv_group) * seq_q + gr / kv_group] =
                l > 0.f ? m + logf(l) : neg_inf();
    }
    __syncthreads();
    constexpr int C4 = HEAD_DIM / 4;                        // 4-column items per row
    constexpr int PER = (16 * C4 + THREADS - 1) / THREADS;  // items per thread with 16 live rows
    constexpr int ICH = PER < 4 ? PER : 4;                  // items summed per pass (bounded registers)
    const int items = live * C4;
    const long long step = all_rows * HEAD_DIM;
    // Item tid + u * THREADS of this thread: (row, 4 columns). Its partial O's offset, or -1 where it has none or
    // the row keeps nothing there (PAIR); loads past the last split are predicated off inside a batch (a
    // remainder loop would issue them one by one).
    auto item_src = [&](int u, int& w_at) {
        const int i = tid + u * THREADS;
        w_at = 0;
        if (i >= items) return -1ll;
        const int r = i / C4, c = (i % C4) * 4;
        if (out_col(r0 + r, c) < 0) return -1ll;
        w_at = r * n_splits;
        return global_row(r0 + r) * HEAD_DIM + c;
    };
    auto part = [&](long long src, int sp) {
        return src >= 0 && sp < n_splits ? __ldcg(reinterpret_cast<const float4*>(o_part + src + sp * step))
                                         : make_float4(0.f, 0.f, 0.f, 0.f);
    };
    auto add = [&](float* acc, float4 x, long long src, int w_at, int sp) {
        const float w = src >= 0 && sp < n_splits ? sW[w_at + sp] : 0.f;
        acc[0] = fmaf(x.x, w, acc[0]), acc[1] = fmaf(x.y, w, acc[1]);
        acc[2] = fmaf(x.z, w, acc[2]), acc[3] = fmaf(x.w, w, acc[3]);
    };
    auto store = [&](int u, const float* acc) {
        const int i = tid + u * THREADS, r = i / C4, c = (i % C4) * 4;
        *reinterpret_cast<uint2*>(o + global_row(r0 + r) * OUT_DIM + out_col(r0 + r, c)) =
            make_uint2(pack2<T>(acc[0], acc[1]), pack2<T>(acc[2], acc[3]));
    };
    if (items <= THREADS) {  // at most one item per thread: 8 splits' loads at a time
        int w_at;
        const long long src = item_src(0, w_at);
        if (src >= 0) {
            float acc[4] = {0.f, 0.f, 0.f, 0.f};
            for (int s0 = 0; s0 < n_splits; s0 += 8) {
                float4 x[8];
#pragma unroll
                for (int e = 0; e < 8; ++e) x[e] = part(src, s0 + e);
#pragma unroll
                for (int e = 0; e < 8; ++e) add(acc, x[e], src, w_at, s0 + e);
            }
            store(0, acc);
        }
    } else {  // ICH items per pass, 2 splits of each at a time
#pragma unroll
        for (int u0 = 0; u0 < PER; u0 += ICH) {
            long long src[ICH];
            int w_at[ICH];
            float acc[ICH][4];
#pragma unroll
            for (int j = 0; j < ICH; ++j) {
                src[j] = item_src(u0 + j, w_at[j]);
                acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
            }
            for (int s0 = 0; s0 < n_splits; s0 += 2) {
                float4 x[ICH][2];
#pragma unroll
                for (int j = 0; j < ICH; ++j)
#pragma unroll
                    for (int e = 0; e < 2; ++e) x[j][e] = part(src[j], s0 + e);
#pragma unroll
                for (int j = 0; j < ICH; ++j)
#pragma unroll
                    for (int e = 0; e < 2; ++e) add(acc[j], x[j][e], src[j], w_at[j], s0 + e);
            }
#pragma unroll
            for (int j = 0; j < ICH; ++j)
                if (src[j] >= 0) store(u0 + j, acc[j]);
        }
    }
}

template <typename T, int HEAD_DIM, int WARPS, int STAGES, bool PAGED, bool PAIR = false, bool WARP_PIPE = false>
__global__ void __launch_bounds__(WARPS * 32, 1) flash_decode(DECODE_PARAMS) {
    decode_body<T, HEAD_DIM, WARPS, STAGES, PAGED, PAIR, 1, WARP_PIPE>(DECODE_ARGS);
}

template <typename T, int HEAD_DIM, int WARPS, int STAGES, bool PAGED, bool PAIR, int CLUSTER, bool WARP_PIPE = false>
__global__ void __launch_bounds__(WARPS * 32, 1) CLUSTER_OF(CLUSTER) flash_decode_cluster(DECODE_PARAMS) {
    decode_body<T, HEAD_DIM, WARPS, STAGES, PAGED, PAIR, CLUSTER, WARP_PIPE>(DECODE_ARGS);
}

// New tokens into the cache: k_new/v_new [batch, seqlen_new, kv_heads, HEAD_DIM] (any strides, head_dim
// contiguous) land at positions cache_seqlens[b] + i (paged like flash_decode). Positions past the cache's
// capacity are dropped (the host checks lengths; this keeps a bad length from writing out of bounds).
// Grid (seqlen_new, kv_heads, batch), HEAD_DIM / 8 threads: one 16-byte chunk each.
template <typename T, bool PAGED>
__global__ void kv_append(const T* __restrict__ k_new, const T* __restrict__ v_new, T* __restrict__ k, T* __restrict__ v,
                          const int* __restrict__ cache_seqlens, const int* __restrict__ block_table, long long n_sb,
                          long long n_ss, long long n_sh, long long vn_sb, long long vn_ss, long long vn_sh,
                          long long k_sb, long long k_ss, long long k_sh, long long v_sb, long long v_ss,
                          long long v_sh, int max_pages, int page, int num_pages, int capacity) {
    const int i = blockIdx.x, kvh = blockIdx.y, b = blockIdx.z, ch = threadIdx.x;
    const int j = __ldg(cache_seqlens + b) + i;
    if (j < 0 || j >= capacity) return;
    const int2 at = kv_row<PAGED>(j, b, block_table, max_pages, page, num_pages);
    const long long koff = row_offset(at, k_sb, k_ss) + kvh * k_sh, voff = row_offset(at, v_sb, v_ss) + kvh * v_sh;
    reinterpret_cast<uint4*>(k + koff)[ch] = reinterpret_cast<const uint4*>(k_new + b * n_sb + i * n_ss + kvh * n_sh)[ch];
    reinterpret_cast<uint4*>(v + voff)[ch] = reinterpret_cast<const uint4*>(v_new + b * vn_sb + i * vn_ss + kvh * vn_sh)[ch];
}
