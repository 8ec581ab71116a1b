// Free TCP ports for tests that must name a port before something listens on it (a job's
// rendezvous, a server started as another process).
//
// A port the kernel picks with bind(0) comes from the ephemeral range, the same range every
// concurrent outgoing connection (gloo's, kubectl's, a health probe's) takes its source port
// from: between the test's check and the moment its process binds, a connection elsewhere
// on the machine can take it. These ports come from below that range
// (/proc/sys/net/ipv4/ip_local_port_range), at random, so only another test's choice can
// meet them, and a second bind attempt is a different draw. Thread-safe.
#pragma once

namespace spawnpoint::testing {

// A port P for which P .. P + consecutive - 1 are all free on every interface now
// (consecutive 2: a job's agents serve its gang on the rendezvous port + 1). Aborts the
// test program if none is found in 1000 draws.
int FreePort(int consecutive = 2);

}  // namespace spawnpoint::testing
