package testenv

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestPostgresRefusesOtherLocalUsers: the throwaway server trusts every
// connection it accepts, so it must accept none from another account on
// the machine. It listens on no TCP port (a connection to 127.0.0.1 on its
// port is refused, and so is one to its URL turned to TCP), and its socket
// lies in a directory only the server's user may enter. Run as root, the
// test also connects as the user nobody with psql and is refused.
func TestPostgresRefusesOtherLocalUsers(t *testing.T) {
	pg := SharedPostgres(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// The owner gets in, over the socket.
	c, err := pgx.Connect(ctx, pg.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	var listen string
	if err := c.QueryRow(ctx, "SHOW listen_addresses").Scan(&listen); err != nil {
		t.Fatal(err)
	}
	c.Close(ctx)
	if listen != "" {
		t.Errorf("listen_addresses = %q, want none", listen)
	}

	// Nobody listens on TCP.
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(pg.Port()))
	if conn, err := net.DialTimeout("tcp", addr, 2*time.Second); err == nil {
		conn.Close()
		t.Errorf("%s accepts TCP connections", addr)
	}
	tcp := fmt.Sprintf("postgres://postgres@%s/postgres?sslmode=disable&connect_timeout=2", addr)
	if c, err := pgx.Connect(ctx, tcp); err == nil {
		c.Close(ctx)
		t.Errorf("connected as the superuser over TCP at %s", addr)
	}

	// The socket's directory: the server user's, and closed to others.
	fi, err := os.Stat(pg.SocketDir())
	if err != nil {
		t.Fatal(err)
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		t.Errorf("socket directory %s has mode %v: other users may reach the socket", pg.SocketDir(), perm)
	}
	if !strings.HasPrefix(pg.URL("x"), "postgres://postgres@/x?host=") {
		t.Errorf("URL %q does not name the socket directory", pg.URL("x"))
	}

	if os.Geteuid() != 0 {
		t.Logf("not root: cannot try another local user; the directory mode above keeps them out")
		return
	}
	nobody, err := user.Lookup("nobody")
	if err != nil {
		t.Fatalf("running as root, the test tries the socket as nobody: %v", err)
	}
	uid, _ := strconv.Atoi(nobody.Uid)
	gid, _ := strconv.Atoi(nobody.Gid)
	psql := filepath.Join(pg.bin, "psql")
	if _, err := os.Stat(psql); err != nil {
		if psql, err = exec.LookPath("psql"); err != nil {
			t.Fatalf("psql, to connect as another user: %v", err)
		}
	}
	cmd := exec.CommandContext(ctx, psql, "-X", "-w", "-h", pg.SocketDir(), "-p", strconv.Itoa(pg.Port()), "-U", "postgres", "-d", "postgres", "-c", "SELECT 1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
	cmd.Dir = "/"
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("the user nobody connected as the superuser:\n%s", out)
	}
	if !strings.Contains(string(out), "Permission denied") {
		t.Errorf("nobody was refused for another reason than the directory's permissions: %v\n%s", err, out)
	}
	t.Logf("nobody: %s", strings.TrimSpace(string(out)))
}
