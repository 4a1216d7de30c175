"""The portable attention path: FlashAttention-2 in Triton, forward and backward, for every NVIDIA GPU from
sm_80 (and the CPU under ``TRITON_INTERPRET=1``), with tile shapes sized to the device."""
