"""What a pass costs: each device's model (the one-op profile, the calibration or the device
model that carries between models) and the pass model that sums a placement's cost from it."""
