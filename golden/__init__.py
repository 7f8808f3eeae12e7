"""numpy reference models, one per hardware block, bit-exact to the hardware."""
