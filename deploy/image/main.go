// Command image builds a container image from files of this machine, with
// no registry and no container engine, and writes it as an archive that
// `ctr images import` and `podman load` accept: an OCI image layout (OCI
// Image Layout Specification) in a tar file, or a docker-archive
// (`docker save` format).
//
// The image has one layer. Each --file names a file of the host and its
// path in the image; a dynamically linked ELF executable brings its shared
// libraries and program interpreter along (read from its DT_NEEDED entries
// and PT_INTERP, searched like the dynamic loader does), so Debian's Open
// vSwitch tools run in the image as they run on the host:
//
//	go run . --tag ghcr.io/seine-net/seine:v0.1.0 --out seine.tar \
//	    --file ../../bin/seine:/usr/local/bin/seine --link seine:/usr/local/bin/seinectl \
//	    --file /usr/sbin/ovs-vswitchd:/usr/sbin/ovs-vswitchd --dir /usr/share/openvswitch:/usr/share/openvswitch \
//	    --entrypoint /usr/local/bin/seine
//
// The image layout and manifests are go-containerregistry's; this command
// only gathers the files.
package main

import (
	"archive/tar"
	"debug/elf"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// multi is a repeatable string flag.
type multi []string

func (m *multi) String() string     { return strings.Join(*m, ",") }
func (m *multi) Set(s string) error { *m = append(*m, s); return nil }

func main() {
	var files, dirs, links, mkdirs, env, cmd multi
	tag := flag.String("tag", "", "image reference, repository:tag (required)")
	out := flag.String("out", "", "archive to write (required)")
	format := flag.String("format", "oci", "oci (OCI image layout in a tar file) or docker (docker save format)")
	entrypoint := flag.String("entrypoint", "", "the image's entrypoint (one path)")
	workdir := flag.String("workdir", "/", "the image's working directory")
	flag.Var(&files, "file", "host:image file, with its shared libraries when it is a dynamic ELF executable (repeatable)")
	flag.Var(&dirs, "dir", "host:image directory tree, copied as it is (repeatable)")
	flag.Var(&links, "link", "target:image symbolic link (repeatable)")
	flag.Var(&mkdirs, "mkdir", "empty directory in the image (repeatable)")
	flag.Var(&env, "env", "KEY=value of the image's environment (repeatable)")
	flag.Var(&cmd, "cmd", "argument of the image's default command (repeatable)")
	flag.Parse()
	if *tag == "" || *out == "" {
		fail(errors.New("--tag and --out are required"))
	}
	ref, err := name.NewTag(*tag)
	if err != nil {
		fail(fmt.Errorf("--tag %q: %w", *tag, err))
	}
	root, err := os.MkdirTemp("", "seine-image-")
	if err != nil {
		fail(err)
	}
	defer os.RemoveAll(root)
	r := rootfs{dir: root, done: map[string]bool{}}
	for _, f := range files {
		src, dst, err := pair(f)
		if err == nil {
			err = r.addExecutable(src, dst)
		}
		if err != nil {
			fail(fmt.Errorf("--file %s: %w", f, err))
		}
	}
	for _, d := range dirs {
		src, dst, err := pair(d)
		if err == nil {
			err = r.addTree(src, dst)
		}
		if err != nil {
			fail(fmt.Errorf("--dir %s: %w", d, err))
		}
	}
	for _, l := range links {
		target, at, err := pair(l)
		if err == nil {
			err = r.link(target, at)
		}
		if err != nil {
			fail(fmt.Errorf("--link %s: %w", l, err))
		}
	}
	for _, d := range mkdirs {
		if err := os.MkdirAll(r.path(d), 0o755); err != nil {
			fail(fmt.Errorf("--mkdir %s: %w", d, err))
		}
	}
	if err := r.finish(); err != nil {
		fail(err)
	}
	if err := write(root, ref, *format, *out, *entrypoint, *workdir, env, cmd); err != nil {
		fail(err)
	}
	fmt.Printf("wrote %s (%s, %s)\n", *out, ref, *format)
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "image:", err)
	os.Exit(1)
}

// pair splits "a:b".
func pair(s string) (string, string, error) {
	a, b, ok := strings.Cut(s, ":")
	if !ok || a == "" || !strings.HasPrefix(b, "/") {
		return "", "", errors.New("want source:/absolute/path/in/image")
	}
	return a, b, nil
}

// rootfs is the image's file tree being assembled in dir.
type rootfs struct {
	dir  string
	done map[string]bool // image paths already added
}

func (r *rootfs) path(p string) string { return filepath.Join(r.dir, p) }

// copyFile copies src (following symlinks) to the image path dst with src's
// mode.
func (r *rootfs) copyFile(src, dst string) error {
	if r.done[dst] {
		return nil
	}
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(r.path(dst)), 0o755); err != nil {
		return err
	}
	o, err := os.OpenFile(r.path(dst), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, fi.Mode().Perm())
	if err != nil {
		return err
	}
	if _, err := io.Copy(o, in); err != nil {
		o.Close()
		return err
	}
	r.done[dst] = true
	return o.Close()
}

// addExecutable copies src to dst and, for a dynamically linked ELF file,
// its program interpreter and every shared library it needs, transitively,
// at the paths where the host's loader finds them.
func (r *rootfs) addExecutable(src, dst string) error {
	if err := r.copyFile(src, dst); err != nil {
		return err
	}
	return r.addLibraries(src)
}

// libDirs are the directories the glibc loader of Debian 12 (amd64)
// searches by default, in order (ld.so(8), and /etc/ld.so.conf.d).
var libDirs = []string{"/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/lib", "/usr/lib", "/usr/local/lib"}

func (r *rootfs) addLibraries(file string) error {
	f, err := elf.Open(file)
	if err != nil {
		return nil // not an ELF file: a script or data
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type != elf.PT_INTERP {
			continue
		}
		b, err := io.ReadAll(p.Open())
		if err != nil {
			return fmt.Errorf("reading the interpreter of %s: %w", file, err)
		}
		interp := strings.TrimRight(string(b), "\x00")
		if err := r.copyFile(interp, interp); err != nil {
			return fmt.Errorf("interpreter of %s: %w", file, err)
		}
	}
	needed, err := f.ImportedLibraries()
	if err != nil {
		return fmt.Errorf("shared libraries of %s: %w", file, err)
	}
	runpath, _ := f.DynString(elf.DT_RUNPATH)
	rpath, _ := f.DynString(elf.DT_RPATH)
	var search []string
	for _, p := range append(runpath, rpath...) {
		search = append(search, strings.Split(p, ":")...)
	}
	search = append(search, libDirs...)
	for _, lib := range needed {
		found := ""
		for _, d := range search {
			if _, err := os.Stat(filepath.Join(d, lib)); err == nil {
				found = filepath.Join(d, lib)
				break
			}
		}
		if found == "" {
			return fmt.Errorf("%s needs %s, found in none of %v", file, lib, search)
		}
		if r.done[found] {
			continue
		}
		if err := r.copyFile(found, found); err != nil {
			return err
		}
		if err := r.addLibraries(found); err != nil {
			return err
		}
	}
	return nil
}

// addTree copies the directory src to dst, keeping symbolic links as links.
func (r *rootfs) addTree(src, dst string) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		to := path.Join(dst, filepath.ToSlash(rel))
		switch {
		case d.IsDir():
			return os.MkdirAll(r.path(to), 0o755)
		case d.Type()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			return r.link(target, to)
		default:
			return r.copyFile(p, to)
		}
	})
}

func (r *rootfs) link(target, at string) error {
	if err := os.MkdirAll(filepath.Dir(r.path(at)), 0o755); err != nil {
		return err
	}
	_ = os.Remove(r.path(at))
	return os.Symlink(target, r.path(at))
}

// finish adds what every image of ours needs besides its files: /tmp, the
// files a container runtime bind-mounts over (/etc/hosts, resolv.conf,
// hostname), a root user, name service order, and the loader's cache of the
// image's own libraries (ldconfig -r), when the image has a loader.
func (r *rootfs) finish() error {
	for _, d := range []string{"tmp", "etc", "var/run", "root"} {
		if err := os.MkdirAll(r.path(d), 0o755); err != nil {
			return err
		}
	}
	if err := os.Chmod(r.path("tmp"), 0o1777|fs.ModeSticky); err != nil {
		return err
	}
	for name, content := range map[string]string{
		"etc/passwd":        "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
		"etc/group":         "root:x:0:\nnogroup:x:65534:\n",
		"etc/nsswitch.conf": "passwd: files\ngroup: files\nhosts: files dns\n",
		"etc/hosts":         "127.0.0.1 localhost\n",
		"etc/resolv.conf":   "",
		"etc/hostname":      "",
	} {
		if _, err := os.Lstat(r.path(name)); err == nil {
			continue
		}
		if err := os.WriteFile(r.path(name), []byte(content), 0o644); err != nil {
			return err
		}
	}
	if len(r.done) == 0 {
		return nil
	}
	for p := range r.done {
		if strings.Contains(p, "/ld-linux") {
			if out, err := exec.Command("ldconfig", "-r", r.dir).CombinedOutput(); err != nil {
				return fmt.Errorf("ldconfig -r: %w: %s", err, out)
			}
			break
		}
	}
	return nil
}

// write packs root into one layer and writes the image archive.
func write(root string, ref name.Tag, format, out, entrypoint, workdir string, env, cmd []string) error {
	layerFile := out + ".layer.tar"
	if err := tarTree(root, layerFile); err != nil {
		return err
	}
	defer os.Remove(layerFile)
	oci := format == "oci"
	if !oci && format != "docker" {
		return fmt.Errorf("--format %q: want oci or docker", format)
	}
	var opts []tarball.LayerOption
	if oci {
		opts = append(opts, tarball.WithMediaType(types.OCILayer))
	}
	layer, err := tarball.LayerFromFile(layerFile, opts...)
	if err != nil {
		return fmt.Errorf("layer: %w", err)
	}
	base := empty.Image
	if oci {
		base = mutate.MediaType(base, types.OCIManifestSchema1)
		base = mutate.ConfigMediaType(base, types.OCIConfigJSON)
	}
	img, err := mutate.AppendLayers(base, layer)
	if err != nil {
		return err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	cf.Config.WorkingDir = workdir
	cf.Config.Env = append([]string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}, env...)
	if entrypoint != "" {
		cf.Config.Entrypoint = []string{entrypoint}
	}
	cf.Config.Cmd = cmd
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return err
	}
	if !oci {
		return tarball.WriteToFile(out, ref, img)
	}
	dir, err := os.MkdirTemp(filepath.Dir(out), ".oci-layout-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	lp, err := layout.Write(dir, empty.Index)
	if err != nil {
		return err
	}
	// containerd names the imported image after io.containerd.image.name;
	// other tools read the OCI reference name.
	if err := lp.AppendImage(img, layout.WithAnnotations(map[string]string{
		"io.containerd.image.name":          ref.String(),
		"org.opencontainers.image.ref.name": ref.String(),
	}), layout.WithPlatform(v1.Platform{OS: "linux", Architecture: "amd64"})); err != nil {
		return err
	}
	return tarTree(dir, out)
}

// tarTree writes the tree under root to a tar file, in a reproducible form:
// sorted, owned by root, without timestamps.
func tarTree(root, out string) error {
	var paths []string
	if err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p != root {
			paths = append(paths, p)
		}
		return nil
	}); err != nil {
		return err
	}
	sort.Strings(paths)
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(f)
	for _, p := range paths {
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		link := ""
		if fi.Mode()&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		}
		h, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		h.Name = filepath.ToSlash(rel)
		if fi.IsDir() {
			h.Name += "/"
		}
		h.Uid, h.Gid, h.Uname, h.Gname = 0, 0, "root", "root"
		h.ModTime, h.AccessTime, h.ChangeTime = time.Unix(0, 0), time.Time{}, time.Time{}
		h.Format = tar.FormatPAX
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if fi.Mode().IsRegular() {
			in, err := os.Open(p)
			if err != nil {
				return err
			}
			_, err = io.Copy(tw, in)
			in.Close()
			if err != nil {
				return err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return f.Close()
}
