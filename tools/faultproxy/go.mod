module spawnpoint.dev/tools/faultproxy

go 1.22
