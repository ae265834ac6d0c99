# Placeholder: the container image is written by the Docker issue
# ("Docker image and docker-compose, built and run for real").
# This file has no instructions yet, so a build of it stops at once.
