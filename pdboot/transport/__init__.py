"""The I/O shell: connections to hosts (SSH or local), known_hosts, fan-out, masking, Docker on a
host over that connection, HTTP, the deployment lock, and opening every host of a deployment."""
