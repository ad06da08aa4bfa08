"""Fix texts that more than one stage's checks give (one place, so the stages never import each other)."""

# P02: the safeguards that keep an upgrade from replacing the pinned driver or the patched module
# (driver.holds, driver.guards, p2p.restore_guards)
RESTORE_FIX = ("an upgrade can now replace the pinned driver or the patched module: run `p2pkit restore` (it puts "
               "the safeguards back and proves the driver and module again)")

# P17: BAR1 P2P needs a pair of GPUs on one host (topology.gpu_pair, link.p2p_pair)
TWO_GPUS = "P2P needs two GPUs; this host has {n}. Seat a second GPU, or judge a two-GPU host"
