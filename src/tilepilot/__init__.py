"""tilepilot: autonomous end-to-end deployment of decoder-only LLMs onto a modeled XDNA2 spatial NPU."""

__version__ = "0.1.0"
