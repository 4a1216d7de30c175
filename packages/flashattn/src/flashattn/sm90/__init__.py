"""The sm90 (H100, H200) attention path: warp-specialised Gluon kernels, forward and backward."""
