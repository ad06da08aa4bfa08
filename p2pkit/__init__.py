"""p2pkit: bring a dual-GPU PCIe P2P host up, stage by stage, with proofs."""

__version__ = "0.1.0"
