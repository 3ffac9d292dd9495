#include "worker/link_probe.h"


#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "common/codec.h"
#include "common/handshake.h"
#include "common/log.h"
#include "common/net.h"

namespace erun::worker {
namespace {

constexpr char kMagic[8] = {'E', 'R', 'U', 'N', 'P', 'R', 'O', 'B'};
constexpr handshake::Scheme kScheme{"erun-link-probe-prober", "erun-link-probe-responder",
                                    handshake::Scheme::Layout::kNoncesLast};

handshake::Proofs proofs(const std::string& job_id, const std::string& secret) {
  return handshake::Proofs(std::make_shared<handshake::Key>(secret), kScheme, job_id);
}

// Answers one prober on `fd` (non-blocking) before `deadline`; an error that
// says why when it is not one of the job's or stalls.
Status answer(int fd, const handshake::Proofs& p, TimePoint deadline, const net::Interrupt* stop) {
  char hello[sizeof(kMagic) + handshake::kNonceBytes];
  if (auto o = net::recv_exact(fd, hello, sizeof(hello), deadline, stop); !o.ok()) return Status::error(o.text());
  if (std::memcmp(hello, kMagic, sizeof(kMagic)) != 0) return Status::error("not a link probe");
  const std::string theirs(hello + sizeof(kMagic), handshake::kNonceBytes);
  const std::string mine = handshake::random_bytes(handshake::kNonceBytes);
  if (auto o = net::send_all(fd, mine + p.responder(theirs, mine), deadline, stop); !o.ok()) {
    return Status::error(o.text());
  }
  std::string proof(handshake::kMacBytes, '\0');
  if (auto o = net::recv_exact(fd, proof.data(), proof.size(), deadline, stop); !o.ok()) return Status::error(o.text());
  if (!handshake::equal_ct(proof, p.initiator(theirs, mine))) return Status::error("failed the job secret's proof");
  char len[4];
  if (auto o = net::recv_exact(fd, len, 4, deadline, stop); !o.ok()) return Status::error(o.text());
  const auto n = static_cast<uint32_t>(get_le(len, 4));
  if (n > kLinkProbeBytes) return Status::error(fmt::format("asked for {} bytes, more than {}", n, kLinkProbeBytes));
  std::string bytes(n, '\0');
  if (auto o = net::recv_exact(fd, bytes.data(), n, deadline, stop); !o.ok()) return Status::error(o.text());
  if (auto o = net::send_all(fd, bytes, deadline, stop); !o.ok()) return Status::error(o.text());
  return Status::ok();
}

}  // namespace

LinkProbeResponder::LinkProbeResponder(const std::string& address, const std::string& job_id,
                                       const std::string& secret, Duration io_timeout) {
  auto p = std::make_shared<const handshake::Proofs>(proofs(job_id, secret));
  server_ = std::make_unique<net::SerialServer>(
      address, 8, [p, io_timeout](int fd, const net::Address& peer, const net::Interrupt& stop) {
        Status s = answer(fd, *p, std::chrono::steady_clock::now() + io_timeout, &stop);
        if (!s.is_ok()) ERUN_LOG_DEBUG("erun: link probe from {} refused: {}", peer.name(), s.message());
      });
  if (server_->port() == 0) ERUN_LOG_WARN("erun: no link probe responder: {}", server_->error());
}

LinkProbeResponder::~LinkProbeResponder() = default;

Result<Duration> probe_link(const std::string& host, int port, const std::string& job_id, const std::string& secret,
                            uint32_t bytes, Duration timeout) {
  bytes = std::min(bytes, kLinkProbeBytes);
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + timeout;
  auto fail = [&](const std::string& what) {
    return Result<Duration>::error(fmt::format("link probe to {}:{}: {}", host, port, what));
  };
  auto addrs = net::resolve(host, std::to_string(port));
  if (!addrs.is_ok() || addrs.value().empty()) return fail("cannot resolve the host");
  net::Socket s = net::connect(addrs.value().front(), deadline);
  if (!s.ok()) return fail(s.outcome.text());
  net::set_nodelay(s.fd.get());
  const int fd = s.fd.get();
  const auto p = proofs(job_id, secret);
  const std::string mine = handshake::random_bytes(handshake::kNonceBytes);
  if (auto o = net::send_all(fd, std::string(kMagic, sizeof(kMagic)) + mine, deadline); !o.ok()) return fail(o.text());
  std::string reply(handshake::kNonceBytes + handshake::kMacBytes, '\0');
  if (auto o = net::recv_exact(fd, reply.data(), reply.size(), deadline); !o.ok()) return fail(o.text());
  const std::string theirs = reply.substr(0, handshake::kNonceBytes);
  if (!handshake::equal_ct(reply.substr(handshake::kNonceBytes), p.responder(mine, theirs))) {
    return fail("the responder failed the job secret's proof");
  }
  constexpr char kFill = '\x5a';
  std::string out = p.initiator(mine, theirs);
  char len[4];
  put_le(len, bytes, 4);
  out.append(len, 4);
  out.append(bytes, kFill);
  if (auto o = net::send_all(fd, out, deadline); !o.ok()) return fail(o.text());
  std::string back(bytes, '\0');
  if (auto o = net::recv_exact(fd, back.data(), bytes, deadline); !o.ok()) return fail(o.text());
  if (std::any_of(back.begin(), back.end(), [](char c) { return c != kFill; })) {
    return fail("the bytes came back changed");
  }
  return Duration(std::chrono::steady_clock::now() - start);
}

}  // namespace erun::worker
