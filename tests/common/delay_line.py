#!/usr/bin/env python3
"""A fixed delay on a simulated node's outgoing IPv4 traffic (tests/common/nodes.sh: node_delay).

netem is the usual tool; kernels built without sch_netem (this machine's) need another way.
Run inside the node's network namespace:

    delay_line.py DEV TUN DELAY_MS PEER_IP=PEER_MAC...

It creates the tun device TUN (it lasts as long as this process); nodes.sh then routes each peer's
address through TUN. Every packet read from TUN leaves DEV (an AF_PACKET socket, the peer's MAC
given here) DELAY_MS later, in order: a one-way delay like netem's on DEV's egress. A packet to any
other address is dropped. Standard library only; stops on SIGTERM/SIGKILL, and the device and its
routes go with it.
"""

import collections
import fcntl
import os
import select
import socket
import struct
import sys
import time

TUNSETIFF = 0x400454CA
IFF_TUN = 0x0001
IFF_NO_PI = 0x1000
ETH_P_IP = 0x0800


def main(argv):
    if len(argv) < 4:
        sys.exit(__doc__)
    dev, tun_name, delay = argv[0], argv[1], float(argv[2]) / 1000.0
    macs = {}
    for pair in argv[3:]:
        ip, mac = pair.split("=")
        macs[socket.inet_aton(ip)] = bytes.fromhex(mac.replace(":", ""))

    tun = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    fcntl.ioctl(tun, TUNSETIFF, struct.pack("16sH", tun_name.encode(), IFF_TUN | IFF_NO_PI))
    out = socket.socket(socket.AF_PACKET, socket.SOCK_DGRAM, 0)  # protocol 0: sends only, receives nothing
    print(f"delay_line: {tun_name} -> {dev}, {delay * 1000:.0f} ms", flush=True)

    held = collections.deque()  # (due, packet), due times in order: the delay is constant
    while True:
        timeout = max(0.0, held[0][0] - time.monotonic()) if held else None
        ready, _, _ = select.select([tun], [], [], timeout)
        if ready:
            while True:
                try:
                    packet = os.read(tun, 65536)
                except BlockingIOError:
                    break
                held.append((time.monotonic() + delay, packet))
        now = time.monotonic()
        while held and held[0][0] <= now:
            packet = held.popleft()[1]
            mac = macs.get(packet[16:20]) if len(packet) >= 20 and packet[0] >> 4 == 4 else None
            if mac is not None:
                try:
                    out.sendto(packet, (dev, ETH_P_IP, 0, 0, mac))
                except OSError:
                    pass  # the link is down: the packet is lost, as on a wire


if __name__ == "__main__":
    main(sys.argv[1:])
