"""edgeflash: run language models on devices whose memory is smaller than the model."""
__version__ = "0.1.0"
