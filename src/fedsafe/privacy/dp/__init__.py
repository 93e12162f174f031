"""Client-level differential privacy: the mechanisms (clipping, noise placements, adaptive
clipping), accounting over dp-accounting's DpEvents, the ``[dp]`` config section, and the
round plugin that puts them into the engine."""
