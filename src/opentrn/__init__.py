"""opentrn: an open, RTL-level model of a Trainium3-like AI accelerator core."""

__version__ = "0.1.0"
