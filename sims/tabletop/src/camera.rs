//! RGB and depth images of a scene's bodies, rendered on the CPU.
