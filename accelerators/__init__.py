"""Device discovery and the execution engines that run models on them."""
