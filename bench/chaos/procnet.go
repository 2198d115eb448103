package main

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// clientPorts maps the local TCP ports of the sockets the processes pids hold open to the
// pid holding each, read from Linux's /proc: each process's fds name their socket
// inodes, and /proc/net/tcp{,6} maps inodes to local addresses.
func clientPorts(pids []int) (map[int]int, error) {
	inodes := map[uint64]int{}
	for _, pid := range pids {
		dir := fmt.Sprintf("/proc/%d/fd", pid)
		entries, err := os.ReadDir(dir)
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				continue // it just died
			}
			return nil, fmt.Errorf("killing MySQL sessions needs Linux /proc: %w", err)
		}
		for _, e := range entries {
			link, err := os.Readlink(filepath.Join(dir, e.Name()))
			if err != nil || !strings.HasPrefix(link, "socket:[") {
				continue
			}
			n, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimPrefix(link, "socket:["), "]"), 10, 64)
			if err == nil {
				inodes[n] = pid
			}
		}
	}
	ports := map[int]int{}
	for _, table := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		f, err := os.Open(table)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		sc.Scan() // the header
		for sc.Scan() {
			// sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode
			fields := strings.Fields(sc.Text())
			if len(fields) < 10 {
				continue
			}
			inode, err := strconv.ParseUint(fields[9], 10, 64)
			pid, ok := inodes[inode]
			if err != nil || !ok {
				continue
			}
			_, portHex, ok := strings.Cut(fields[1], ":")
			if !ok {
				continue
			}
			if port, err := strconv.ParseUint(portHex, 16, 32); err == nil {
				ports[int(port)] = pid
			}
		}
		f.Close()
	}
	return ports, nil
}
