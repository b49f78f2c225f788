// Flash attention forward on Hopper the warp-specialised way (sm_90a only): tensor-memory-accelerator loads from
// a producer warp into an mbarrier ring of K/V stages, two consumer warpgroups on wgmma, and within each consumer
// the next tile's Q K^T issued before this tile's P V so the softmax of one runs while the tensor cores work on
// the other.
//
// Layout and arguments: as flash_fwd_wgmma (flash_fwd_sm90.cu), except that q, k and v arrive as tensor maps
// (cukernels/tma.py): rank 4, (head_dim, seq, heads, batch) innermost first, box 64 x BLOCK_M (q) or 64 x BLOCK_N
// (k, v) x 1 x 1, 128-byte swizzle, so one copy fills one 64-column block of the blocked layout wgmma reads
// (wgmma.cuh) and rows past the tensor's end arrive as zeros. A packed batch (MASK_VARLEN) has maps over
// [total, heads, head_dim] (batch 1) and the kernel adds the sequence's first row to the row coordinate; rows past
// a sequence's end inside the packed tensor are the next sequence's, masked like any key past seq_kv and never
// stored as query rows.
//
// Grid: (query tiles, heads, batch) as flash_fwd_wgmma, heaviest (last) query tiles first; BLOCK_M = 64 x
// CONSUMERS (128 or, at head dim 64, 192 or 256: each K/V stage then feeds 1.5x or 2x the query rows, 256 with
// 64-key stages; or 64 with one consumer and no pingpong, two CTAs per SM: one's start and epilogue run under the
// other's loop, or three with 64-key stages). PERSISTENT: at most one CTA per SM, each taking query tiles in rounds
// (tile_at below); the K/V ring runs on from one tile to the next, the producer loads the next tile's Q once every
// consumer has released this one's (q_empty, after its last Q K^T), and O is staged in its own rows behind the K/V
// stages, so the next tile's loads overlap this one's last P V and epilogue. Not for packed batches (their CTAs map
// tiles from the sequences).
// Block: 128 x (CONSUMERS + 1) threads = a producer warpgroup and CONSUMERS consumer warpgroups.
//   warpgroup 0, the producer (setmaxnreg 32; 24 with four consumers): lane 0 of warp 0 loads Q once (q_bar),
//     then per visible KV tile j waits until K's slot of stage j % STAGES is free (empty_k: every consumer's Q K^T
//     of the tile that held it is done) and loads K (full_k), then the same for V (empty_v after every consumer's
//     P V; full_v); each barrier is told the bytes it must see first. K is freed a GEMM earlier than V, so the
//     next K arrives sooner. The first tile's Q and first K/V stage are issued by that same thread right after it
//     initialises the barriers, before the CTA-wide __syncthreads (not for packed batches, whose tile lookup is a
//     warp scan).
//   warpgroups 1.., the consumers (setmaxnreg 232 with two, 160 with three, 112 with four, 224 with one, 128 at
//     three CTAs per SM: the CTA's launch registers split so that the producer keeps 32, 24 with four): consumer c
//     owns query rows [64 c, 64 c + 64). Per tile:
//       S(j+1) = Q K(j+1)^T      issued (wgmma m64n{BLOCK_N}k16, both operands from shared memory)
//       O += P(j) V(j)           issued (P from registers, V MN-major in shared memory)
//       wait for S(j+1), release K(j+1); masks and softmax of S(j+1) (new max, exponentials, row sums) while
//       P V runs; wait for P V, release V(j); O *= alpha(j+1) (only where a row's max grew past 2^8: lazy
//       rescaling, softmax_update); P(j+1) = S(j+1) rounded to T.
//   The accumulator registers of an in-flight group are pinned (wgmma::fence_operands) so the compiler does not
//   move their updates across the waits.
// Epilogue: each consumer stages O / l in its own rows of Q's space (the blocked, swizzled layout; its last read
// of Q is done) and writes whole rows with 16-byte stores; LSE as flash_fwd.
//
// Shared memory (1024-byte aligned): Q (BLOCK_M x HEAD_DIM), STAGES x K, STAGES x V (BLOCK_N x HEAD_DIM), O's
// staging rows (PERSISTENT only, BLOCK_M x HEAD_DIM), then the barriers: q_bar, full_k[STAGES], full_v[STAGES],
// empty_k[STAGES], empty_v[STAGES], q_empty (PERSISTENT only).
#include "sm90_common.cuh"
#include "tma.cuh"
#include "pdl.cuh"

using namespace attn;

// FWD_TIMELINE=N (a probe for tools/fwd_timeline.py; never defined in the engine's builds, whose SASS it leaves
// untouched): the first consumer thread of each of the first N CTAs writes global-timer stamps into
// fwd_timeline[cta][slot], each slot once (the host zeroes it first; a persistent CTA's stamps are its first tile's):
// 0 the CTA starts, 1 its Q has landed, 2 its first K, 3 its last P V is done, 4 its O is stored, 5 the SM it ran on.
#ifdef FWD_TIMELINE
#include "timeline.cuh"
__device__ unsigned long long fwd_timeline[FWD_TIMELINE][8];
#define FWD_STAMP(slot, value)                                                                                    \
    do {                                                                                                          \
        const unsigned cta_ = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);                     \
        if (threadIdx.x == 128 && cta_ < FWD_TIMELINE && fwd_timeline[cta_][slot] == 0)                           \
            fwd_timeline[cta_][slot] = (value);                                                                   \
    } while (0)
#else
#define FWD_STAMP(slot, value) \
    do {                       \
    } while (0)
#endif

template <typename T, int HEAD_DIM, int BLOCK_N, int STAGES, bool PINGPONG, int MASK, int CONSUMERS = 2,
          bool PERSISTENT = false, int CTAS_PER_SM = (CONSUMERS == 1 ? 2 : 1)>
__global__ void __launch_bounds__(128 * (CONSUMERS + 1), CTAS_PER_SM)
flash_fwd_tma(const __grid_constant__ tma::TensorMap q_map, const __grid_constant__ tma::TensorMap k_map,
              const __grid_constant__ tma::TensorMap v_map, T* __restrict__ o, float* __restrict__ lse,
              const int* __restrict__ q_ids, const int* __restrict__ kv_ids, const int2* __restrict__ q_tile_ids,
              const int2* __restrict__ kv_tile_ids, int seq_q, int seq_kv, int heads, int kv_group,
              int window_left, int window_right, float scale_log2, int batch, int by_weight) {
    constexpr int BLOCK_M = 64 * CONSUMERS;
    // the consumers' registers: what the producer's 32 leave of the CTA's launch allocation, a multiple of 8, <= 232.
    // setmaxnreg.inc draws on that allocation only: a thread's launch registers (65536 / (threads x CTAS_PER_SM),
    // rounded down to 8) times the threads; asking for more hangs the CTA. One consumer: two CTAs per SM (224), or
    // three (CTAS_PER_SM 3: 80 at launch, 128 per consumer; 64-key stages only, 128 keys need more). Four consumers:
    // 96 at launch, the producer 24, 112 each (64-key stages only)
    constexpr int CONSUMER_REGS =
        CONSUMERS == 1 ? (CTAS_PER_SM == 3 ? 128 : 224) : CONSUMERS == 2 ? 232 : CONSUMERS == 3 ? 160 : 112;
    constexpr int PRODUCER_REGS = CONSUMERS == 4 ? 24 : 32;
    constexpr int LAUNCH_REGS = (65536 / (128 * (CONSUMERS + 1) * CTAS_PER_SM)) & ~7;
    static_assert(CONSUMERS >= 1 && CONSUMERS <= 4, "one to four consumer warpgroups");
    static_assert(CONSUMERS < 4 || (HEAD_DIM == 64 && BLOCK_N == 64), "four consumers: head dim 64, 64-key stages");
    static_assert(CTAS_PER_SM == (CONSUMERS == 1 ? 2 : 1) ||
                      (CONSUMERS == 1 && CTAS_PER_SM == 3 && BLOCK_N == 64 && HEAD_DIM == 64),
                  "CTAs per SM: 2 with one consumer (3 at head dim 64 with 64-key stages), else 1");
    static_assert(128 * PRODUCER_REGS + 128 * CONSUMERS * CONSUMER_REGS <= 128 * (CONSUMERS + 1) * LAUNCH_REGS,
                  "register file");
    static_assert(!(PINGPONG && CONSUMERS == 1), "pingpong needs two consumers or more");
    constexpr int CHUNKS = HEAD_DIM / 8;  // 16-byte chunks per row
    constexpr int NT = BLOCK_N / 8;       // 8-column tiles of S
    constexpr int DT = HEAD_DIM / 8;      // 8-column tiles of O
    constexpr int BLOCKS = HEAD_DIM / 64; // 64-column blocks of a row
    constexpr bool WINDOW = (MASK & 1) != 0;
    constexpr bool SEGMENTS = (MASK & 2) != 0;
    constexpr bool VARLEN = (MASK & MASK_VARLEN) != 0;
    constexpr int Q_BYTES = BLOCK_M * HEAD_DIM * 2, KV_BYTES = BLOCK_N * HEAD_DIM * 2;
    static_assert(HEAD_DIM % 64 == 0 && HEAD_DIM <= 256, "head_dim 64, 128 or 256");
    static_assert(BLOCK_N == 64 || BLOCK_N == 80 || BLOCK_N == 128, "wgmma N of S");

    static_assert(!(PERSISTENT && VARLEN), "a packed batch maps its tiles per CTA (not persistent)");
    constexpr int O_BYTES = PERSISTENT ? Q_BYTES : 0;  // O's staging space (else Q's)

    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const unsigned raw0 = smem_addr(smem_raw);
    const unsigned sQ = (raw0 + 1023) & ~1023u;  // smem_bytes() reserves the slack
    const unsigned sK = sQ + Q_BYTES, sV = sK + STAGES * KV_BYTES;
    const unsigned sO = PERSISTENT ? sV + STAGES * KV_BYTES : sQ;
    const unsigned q_bar = sV + STAGES * KV_BYTES + O_BYTES, full_k = q_bar + 8, full_v = full_k + 8 * STAGES,
                   empty_k = full_v + 8 * STAGES, empty_v = empty_k + 8 * STAGES, q_empty = empty_v + 8 * STAGES;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    FWD_STAMP(0, global_timer_ns());
    FWD_STAMP(5, sm_id() + 1);
    const int wg = wgmma::warpgroup();  // warp-uniform to the compiler: Q's descriptors in uniform registers

    // ---- the CTA's query tiles. One per CTA: (gridDim.x - 1 - blockIdx.x, blockIdx.y, blockIdx.z), heaviest
    // (last) query tiles first; with by_weight (a causal mask whose K/V fit L2: attention/configs.py tile_order)
    // the grid is (heads, batch, n_m) and CTA (h, b, z) takes query tile n_m - 1 - z of head h, batch b: in launch
    // order query tile n_m - 1 of every head and batch, then n_m - 2, ..., so the heaviest tiles of the whole grid
    // start first (no division at the CTA's start, which is on the critical path: numbering the CTAs of an (n_m,
    // heads, batch) grid by weight with three divisions ran 1-2 % slower, 2026-11-26).
    // PERSISTENT: a grid of the CTAs that fit at once over the n_m x heads x batch tiles, numbered as that grid's
    // CTAs (query tiles of a head, heaviest first, then heads, then batch: the CTAs at work at once share few heads'
    // K/V in L2), or with by_weight (a causal/window mask whose K/V all fit in L2: the host's choice,
    // attention/configs.py persistent_order) heaviest first across heads (query tile n_m - 1 of
    // every head and batch, then n_m - 2, ...); round r of CTA c takes tile r G + c, every other round in reverse
    // (r G + G - 1 - c), so by weight the rounds pair heavy and light tiles whatever n_m and G are.
    // Each role works its tiles out after taking its registers (values live across setmaxnreg.dec would have to fit
    // the producer's few).
    struct Tile {
        int m_block, head, b, q_row0, kv_row0, seq_q, seq_kv;  // q_row0 / kv_row0: a packed sequence's first rows
    };
    auto tile_at = [&](int i, Tile& tl) {  // the CTA's i-th tile; false past its last
        tl.q_row0 = tl.kv_row0 = 0;
        tl.seq_q = seq_q;
        tl.seq_kv = seq_kv;
        if constexpr (PERSISTENT) {
            const int n_m = (seq_q + BLOCK_M - 1) / BLOCK_M, G = gridDim.x;
            const int t = i * G + ((i & 1) ? G - 1 - (int)blockIdx.x : (int)blockIdx.x);
            if (t >= n_m * heads * batch) return false;
            if (by_weight) {
                tl.m_block = n_m - 1 - t / (heads * batch);
                tl.head = t % heads;
                tl.b = t / heads % batch;
            } else {
                tl.m_block = n_m - 1 - t % n_m;
                tl.head = t / n_m % heads;
                tl.b = t / n_m / heads;
            }
        } else {
            if (i > 0) return false;
            if (by_weight) {  // grid (heads, batch, n_m): the launch order is the order by weight
                tl.m_block = gridDim.z - 1 - blockIdx.z;
                tl.head = blockIdx.x;
                tl.b = blockIdx.y;
            } else {
                tl.m_block = gridDim.x - 1 - blockIdx.x;
                tl.head = blockIdx.y;
                tl.b = blockIdx.z;
            }
        }
        if constexpr (VARLEN) {  // false: a packed batch's grid runs past its last tile (every thread alike)
            int tile;
            if (!varlen_tile<BLOCK_M>(q_ids, batch, seq_q, blockIdx.x, tl.b, tile)) return false;
            const VarlenSeq sq = varlen_seq(q_ids, tl.b, seq_q), sk = varlen_seq(kv_ids, tl.b, seq_kv);
            tl.q_row0 = sq.start;
            tl.kv_row0 = sk.start;
            tl.seq_q = sq.len;
            tl.seq_kv = sk.len;
            tl.m_block = (sq.len + BLOCK_M - 1) / BLOCK_M - 1 - tile;
            tl.b = 0;
        }
        return true;
    };
    auto kv_tiles = [&](const Tile& tl) {
        const int m0 = tl.m_block * BLOCK_M;
        const int m_tiles = VARLEN ? gridDim.x : (seq_q + BLOCK_M - 1) / BLOCK_M;
        return KvTileRange<BLOCK_N, WINDOW, SEGMENTS>(m0, min(m0 + BLOCK_M, tl.seq_q) - 1, tl.seq_q, tl.seq_kv,
                                                      window_left, window_right, q_tile_ids, kv_tile_ids, tl.b,
                                                      tl.m_block, m_tiles);
    };

    // The copies, by the producer's loading lane: a tile's Q (one per 64-column block, on q_bar), and K or V of
    // its K/V tile nb (KV head kv_head, worked out once per tile) into stage s (bytes announced on full_bars'
    // barrier of the stage; the caller has waited for the slot to be free)
    auto load_q = [&](const Tile& tl) {
        tma::mbar_arrive_expect_tx(q_bar, Q_BYTES);
#pragma unroll
        for (int c = 0; c < BLOCKS; ++c)
            tma::load_4d(sQ + c * (BLOCK_M * 128), q_map, q_bar, 64 * c, tl.q_row0 + tl.m_block * BLOCK_M, tl.head,
                         tl.b);
    };
    auto load_kv = [&](unsigned dst, const tma::TensorMap& map, unsigned full_bars, const Tile& tl, int kv_head,
                       int nb, int s) {
        tma::mbar_arrive_expect_tx(full_bars + 8 * s, KV_BYTES);
#pragma unroll
        for (int c = 0; c < BLOCKS; ++c)
            tma::load_4d(dst + s * KV_BYTES + c * (BLOCK_N * 128), map, full_bars + 8 * s, 64 * c,
                         tl.kv_row0 + nb * BLOCK_N, kv_head, tl.b);
    };

    // Set up by thread 0, which is also the producer's loading lane: the barriers, then (not for a packed batch,
    // whose tile lookup is a warp scan) the first tile's Q and its first K/V stage, issued before the CTA-wide
    // barrier so that the CTA's first memory trips start while the other warps arrive.
    constexpr bool EARLY = !VARLEN;
    if (tid == 0) {
        tma::prefetch_map(q_map);
        tma::prefetch_map(k_map);
        tma::prefetch_map(v_map);
        tma::mbar_init(q_bar, 1);
        for (int s = 0; s < STAGES; ++s) {
            tma::mbar_init(full_k + 8 * s, 1);
            tma::mbar_init(full_v + 8 * s, 1);
            tma::mbar_init(empty_k + 8 * s, CONSUMERS);
            tma::mbar_init(empty_v + 8 * s, CONSUMERS);
        }
        if constexpr (PERSISTENT) tma::mbar_init(q_empty, CONSUMERS);
        tma::fence_mbar_init();
        if constexpr (EARLY) {
            pdl::wait();
            Tile tl;
            if (tile_at(0, tl)) {
                load_q(tl);
                const auto tiles = kv_tiles(tl);
                const int nb = tiles.next_visible(tiles.nb_min);
                if (nb < tiles.nb_max) {  // stage 0's slots are free: nothing to wait for
                    load_kv(sK, k_map, full_k, tl, tl.head / kv_group, nb, 0);
                    load_kv(sV, v_map, full_v, tl, tl.head / kv_group, nb, 0);
                }
            }
        }
    }
    __syncthreads();
    pdl::enter();  // set up: from here on the previous kernel's outputs are read and ours written

    if (wg == 0) {  // ---------------------------------------------------------------- producer
        ws::regs_dec<PRODUCER_REGS>();
        // warp 0 looks its tile up together (a packed batch's lookup is a warp scan), lane 0 loads; a persistent
        // CTA's lookups are arithmetic: lane 0 alone
        if (warp != 0 || (PERSISTENT && lane != 0)) return;
        int j = 0;  // K/V tiles loaded so far: the ring runs on across the CTA's query tiles
        Tile tl;
        for (int i = 0; tile_at(i, tl); ++i) {
            if constexpr (!PERSISTENT)
                if (lane != 0) break;  // (one tile per CTA here)
            const auto tiles = kv_tiles(tl);
            const int kv_head = tl.head / kv_group;
            if (!EARLY || i > 0) {  // (the first tile's Q was issued at the start)
                if constexpr (PERSISTENT) tma::mbar_wait(q_empty, (i & 1) ^ 1);  // every consumer's last Q K^T done
                load_q(tl);
            }
            for (int nb = tiles.next_visible(tiles.nb_min); nb < tiles.nb_max; nb = tiles.next_visible(nb + 1), ++j) {
                const int s = j % STAGES;
                // K, then V: wait until the slot is free, then the copies
                auto load = [&](unsigned dst, const tma::TensorMap& map, unsigned empty_bars, unsigned full_bars) {
                    tma::mbar_wait(empty_bars + 8 * s, ((j / STAGES) & 1) ^ 1);
                    load_kv(dst, map, full_bars, tl, kv_head, nb, s);
                };
                // the first tile's first stage was issued at the start (where it has one: a persistent CTA's first
                // tile may see no key, and its next tile's first load, j == 0 with i > 0, goes out here). No flag
                // carried over from the setup: a per-thread value live across __syncthreads cost the consumers their
                // uniform-register descriptors (R2UR per wgmma: 3 -> 51 at d64, caught by the SASS test)
                if (EARLY && i == 0 && j == 0) continue;
                load(sK, k_map, empty_k, full_k);
                load(sV, v_map, empty_v, full_v);
            }
            if constexpr (!PERSISTENT) break;  // one tile (lets the compiler see a single pass)
        }
        return;
    }

    // -------------------------------------------------------------------- consumers
    ws::regs_inc<CONSUMER_REGS>();
    const int cw = wg - 1, tg = tid - 128 * wg;
    const int g = lane >> 2, t = lane & 3;
    const int warp_row = cw * 64 + (warp & 3) * 16;  // this warp's 16 rows in the tile
    const unsigned q_wg = sQ + cw * 64 * 128;  // this warpgroup's 64 rows inside each 64-column block of Q
    int j = 0;  // K/V tiles consumed so far (the producer's count)
    Tile tl;
    for (int i = 0; tile_at(i, tl); ++i) {
        const int m0 = tl.m_block * BLOCK_M;
        const auto tiles = kv_tiles(tl);
        const int first = tiles.next_visible(tiles.nb_min);
        const int shift = tl.seq_kv - tl.seq_q;

        float o_acc[DT][4];
        float(&o_flat)[DT * 4] = reinterpret_cast<float(&)[DT * 4]>(o_acc);  // the wgmma operand view
        float s[NT][4];
        float(&s_flat)[NT * 4] = reinterpret_cast<float(&)[NT * 4]>(s);
        unsigned p[BLOCK_N / 16][4];  // P of the tile whose P V is next, the A fragments of its k-steps
        float row_max[2], row_sum[2];
        int qid[2];
        init_rows<DT, SEGMENTS>(o_acc, row_max, row_sum, qid, m0 + warp_row + g, tl.seq_q,
                                q_ids + (long long)tl.b * tl.seq_q);

        auto issue_s = [&](int stage) {  // S = Q K^T of the tile in `stage`, one wgmma group (not waited for)
            issue_qk<T, HEAD_DIM, BLOCK_M, BLOCK_N>(s_flat, q_wg, sK + stage * KV_BYTES);
        };
        auto issue_pv = [&](int stage) {  // O += P V of the tile in `stage`, one wgmma group (not waited for)
            const unsigned v_lo = wgmma::desc_lo_mn_major(sV + stage * KV_BYTES, BLOCK_N * 128);
            wgmma::fence();
#pragma unroll
            for (int kj = 0; kj < BLOCK_N / 16; ++kj)
                wgmma::mma_rs_bt<T, HEAD_DIM>(o_flat, p[kj], wgmma::desc_of(v_lo + kj * 128));  // 16 rows of 128 B
            wgmma::commit();
        };
        auto softmax = [&](int nb, float(&alpha)[2]) {  // masks and online softmax of S (tile nb), in place
            if (tiles.needs_mask(nb)) {
                mask_scores<NT, WINDOW, SEGMENTS>(s, nb * BLOCK_N, m0 + warp_row + g + shift, tl.seq_kv, window_left,
                                                  window_right, kv_ids + (long long)tl.b * tl.seq_kv, qid, t);
                softmax_update<NT, true, true>(s, row_max, row_sum, scale_log2, alpha);
            } else {
                softmax_update<NT, false, true>(s, row_max, row_sum, scale_log2, alpha);
            }
        };
        auto pack_p = [&]() {
#pragma unroll
            for (int kj = 0; kj < BLOCK_N / 16; ++kj) pack_a_fragment<T>(s[2 * kj], s[2 * kj + 1], p[kj]);
        };
        auto release = [&](unsigned bars, int stage) {  // empty_k or empty_v
            if (tg == 0) tma::mbar_arrive(bars + 8 * stage);
        };
        auto release_q = [&]() {  // this warpgroup's last read of Q in this tile is done: the next tile's may come
            if constexpr (PERSISTENT) release(q_empty, 0);
        };
        // pingpong: the consumers take turns issuing their GEMMs in a ring (named barrier 1 + CONSUMERS + c: consumer
        // c's turn; 1 + c is its epilogue's), so one's tensor-core work runs while the others compute their softmax.
        // Consumer 0 goes first (the last one hands it the first turn); every turn ends by handing over to the next,
        // except the last consumer's last turn (the arrivals on each barrier match its waits). Per query tile, so
        // across a persistent CTA's tiles too: the last consumer's first hand-over of a tile follows its last turn of
        // the tile before, which follows every other consumer's last turn there.
        auto turn_take = [&]() {
            if constexpr (PINGPONG) ws::bar_sync(1 + CONSUMERS + cw, 256);
        };
        auto turn_pass = [&]() {
            if constexpr (PINGPONG) ws::bar_arrive(1 + CONSUMERS + (cw + 1) % CONSUMERS, 256);
        };

        tma::mbar_wait(q_bar, i & 1);  // always: the CTA may not exit with Q's copy in flight
        FWD_STAMP(1, global_timer_ns());
        if (first < tiles.nb_max) {
            int nb = first;
            if (cw == CONSUMERS - 1) turn_pass();
            const int st0 = j % STAGES;
            tma::mbar_wait(full_k + 8 * st0, (j / STAGES) & 1);
            FWD_STAMP(2, global_timer_ns());
            turn_take();
            issue_s(st0);
            turn_pass();
            wgmma::wait<0>();
            wgmma::fence_operands(s_flat);
            release(empty_k, st0);
            float alpha[2];
            softmax(nb, alpha);  // O is still zero: no rescale
            pack_p();
            for (int nn = tiles.next_visible(nb + 1); nn < tiles.nb_max; nn = tiles.next_visible(nn + 1)) {
                const int st = j % STAGES, st_n = (j + 1) % STAGES;
                tma::mbar_wait(full_k + 8 * st_n, ((j + 1) / STAGES) & 1);
                tma::mbar_wait(full_v + 8 * st, (j / STAGES) & 1);
                wgmma::fence_operands(o_flat);
                turn_take();
                issue_s(st_n);
                issue_pv(st);
                turn_pass();
                wgmma::wait<1>();  // S of the next tile is done; P V of this one may still run
                wgmma::fence_operands(s_flat);
                release(empty_k, st_n);
                softmax(nn, alpha);
                wgmma::wait<0>();
                wgmma::fence_operands(o_flat);
                wgmma::fence_operands(reinterpret_cast<unsigned(&)[BLOCK_N / 4]>(p));
                release(empty_v, st);
                // lazy rescaling (softmax_update's LAZY, in every tile: +1-6 % with two or three consumers, v3.10;
                // +0-7 % with one, v3.17): rows whose max grew little kept their reference (alpha exactly 1); the warp
                // skips the multiplies when all of its rows did
                if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f))
                    rescale_rows<DT>(o_acc, alpha);
                pack_p();
                nb = nn;
                ++j;
            }
            release_q();  // every Q K^T of the tile is done
            const int st = j % STAGES;
            tma::mbar_wait(full_v + 8 * st, (j / STAGES) & 1);
            wgmma::fence_operands(o_flat);
            turn_take();
            issue_pv(st);
            if (cw != CONSUMERS - 1) turn_pass();
            wgmma::wait<0>();
            wgmma::fence_operands(o_flat);
            release(empty_v, st);
            ++j;
            FWD_STAMP(3, global_timer_ns());
        } else {
            release_q();
        }

        // ---- epilogue: O / l staged in this warpgroup's rows of its staging space (Q's, whose last read is done, or
        // PERSISTENT its own, as the next tile's Q may be arriving; blocked, swizzled), then 16-byte stores
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            float inv;
            const float row_lse = finish_row(row_sum[h], row_max[h], scale_log2, inv);
            const int r = warp_row + g + 8 * h;
#pragma unroll
            for (int dt = 0; dt < DT; ++dt) {
                const unsigned addr = sO + wgmma::blocked_offset<BLOCK_M>(r, dt) + 4 * t;
                const unsigned v = pack2<T>(o_acc[dt][2 * h] * inv, o_acc[dt][2 * h + 1] * inv);
                asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v));
            }
            if (t == 0 && m0 + r < tl.seq_q)  // lse [batch, heads, seq_q], or [heads, total_q] packed
                lse[(VARLEN ? (long long)tl.head * seq_q + tl.q_row0 : ((long long)tl.b * heads + tl.head) * seq_q) +
                    m0 + r] = row_lse;
        }
        ws::bar_sync(1 + cw, 128);
#pragma unroll
        for (int it = 0; it < 64 * CHUNKS / 128; ++it) {
            const int idx = it * 128 + tg;
            const int r = cw * 64 + idx / CHUNKS, ch = idx % CHUNKS;
            const int grow = m0 + r;
            if (grow < tl.seq_q) {
                uint4 v;
                asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                             : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                             : "r"(sO + wgmma::blocked_offset<BLOCK_M>(r, ch)));
                T* dst = o + (((long long)tl.b * tl.seq_q + tl.q_row0 + grow) * heads + tl.head) * HEAD_DIM + ch * 8;
                *reinterpret_cast<uint4*>(dst) = v;
            }
        }
        FWD_STAMP(4, global_timer_ns());
        if constexpr (!PERSISTENT) break;
        ws::bar_sync(1 + cw, 128);  // the staging rows are read before the next tile's writes
    }
}
