// The collective algorithms over Transport (transport.h); TcpCommunicator
// picks one per call. docs/design.md; crossovers: docs/performance.md section 8.
#pragma once

#include <cstddef>
#include <vector>

#include "collectives/tcp/pair.h"
#include "collectives/tcp/sender.h"
#include "collectives/tcp/transport.h"

namespace erun::tcp {

using ReduceFn = void (*)(void* out, const void* a, const void* b, size_t n);

// What the algorithms run over: the transport, the sender thread of a large
// ring, and scratch memory kept between operations.
struct Workspace {
  Transport& transport;
  Sender& sender;
  bool cpu_per_rank = true;  // the job has no more ranks on this machine than it has CPUs
  std::vector<char> scratch;
  // A ring reduce-scatter's partial blocks (all but two of the n blocks);
  // kept, as scratch is, at its largest size so far.
  std::vector<char> partials;
};

// Byte offsets of the n blocks of `total` units of `unit` bytes each: block i
// is [off[i], off[i+1]).
std::vector<size_t> block_offsets(size_t total, int n, size_t unit = 1);
// The offsets of n blocks of `bytes` each.
std::vector<size_t> equal_blocks(int n, size_t bytes);

// Allreduce of `count` elements of `esize` bytes at `data`; every rank ends
// with the same bits. Small (direct.cc): everyone sends everything to everyone.
void allreduce_direct(Workspace& w, const Call& c, char* data, size_t count, size_t esize, ReduceFn fn);
// Medium (scatter_gather.cc): a direct reduce-scatter, then a direct allgather.
void allreduce_scatter_gather(Workspace& w, const Call& c, char* data, size_t count, size_t esize, ReduceFn fn);
// Large (ring.cc): one pipelined ring stream, its sends on the sender thread
// for large blocks.
void allreduce_ring(Workspace& w, const Call& c, char* data, size_t count, size_t esize, ReduceFn fn);

// Reduce-scatters of the blocks [off[i], off[i+1]) (byte offsets, whole
// elements, any of them empty) of `in`, which is only read: rank i ends with
// block i reduced at `out`. Direct (scatter_gather.cc): every rank sends
// block q to rank q in one step, which reduces the n inputs in rank order.
// Ring (ring.cc): the allreduce ring's first n-1 steps, pipelined the same
// way, the partial blocks in w.partials.
void direct_reduce_scatter(Workspace& w, const Call& c, const char* in, char* out, const std::vector<size_t>& off,
                           size_t esize, ReduceFn fn);
void reduce_scatter_ring(Workspace& w, const Call& c, const char* in, char* out, const std::vector<size_t>& off,
                         size_t esize, ReduceFn fn);
// out = slot 0 op slot 1 op ... op slot n-1 (slots of `bytes` each, one per
// rank, in rank order), so that every rank computing it gets the same bits.
void reduce_slots(int n, char* out, const char* slots, size_t bytes, size_t count, ReduceFn fn);

// Allgathers of the blocks [off[i], off[i+1]) of `base`, rank i's block
// complete on rank i (allgather.cc). Direct: in one exchange; ring: in n-1
// steps, starting from block `own`; blocks: direct when small, else the ring.
void direct_allgather(Transport& t, const Call& c, char* base, const std::vector<size_t>& off);
void ring_allgather(Transport& t, const Call& c, char* base, const std::vector<size_t>& off, int own);
void allgather_blocks(Transport& t, const Call& c, char* base, const std::vector<size_t>& off);

// Broadcast (broadcast.cc): the root sends to every rank; or it scatters
// the blocks and a ring allgather follows (the root sends each byte ~twice).
void broadcast_direct(Transport& t, const Call& c, char* data, size_t bytes, int root);
void broadcast_scatter_allgather(Transport& t, const Call& c, char* data, size_t bytes, int root);
// Dissemination (broadcast.cc): round k, tell rank+2^k and hear from rank-2^k.
void barrier_dissemination(Transport& t, const Call& c);

}  // namespace erun::tcp
