package controlplane

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"time"
)

// certValidity is how long the sandbox CA and every certificate it signs
// stay valid. The sandbox is short-lived, one year is ample.
const certValidity = 365 * 24 * time.Hour

// keyPair is a certificate with its private key, both parsed.
type keyPair struct {
	cert *x509.Certificate
	der  []byte
	key  *ecdsa.PrivateKey
}

// certPEM returns the certificate as one PEM "CERTIFICATE" block.
func (kp *keyPair) certPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: kp.der})
}

// keyPEM returns the private key as one PEM "EC PRIVATE KEY" block (SEC 1).
func (kp *keyPair) keyPEM() ([]byte, error) {
	return ecKeyPEM(kp.key)
}

func ecKeyPEM(k *ecdsa.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		return nil, fmt.Errorf("marshal ECDSA private key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), nil
}

// writeFiles writes the certificate to certPath (0644) and the key to
// keyPath (0600).
func (kp *keyPair) writeFiles(certPath, keyPath string) error {
	if err := os.WriteFile(certPath, kp.certPEM(), 0o644); err != nil {
		return fmt.Errorf("write certificate: %w", err)
	}
	kb, err := kp.keyPEM()
	if err != nil {
		return err
	}
	if err := os.WriteFile(keyPath, kb, 0o600); err != nil {
		return fmt.Errorf("write private key: %w", err)
	}
	return nil
}

func serialNumber() (*big.Int, error) {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 126))
	if err != nil {
		return nil, fmt.Errorf("random serial number: %w", err)
	}
	return n, nil
}

// newCA makes a self-signed ECDSA P-256 certificate authority.
func newCA(commonName string, now time.Time) (*keyPair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate CA key: %w", err)
	}
	sn, err := serialNumber()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          sn,
		Subject:               pkix.Name{CommonName: commonName},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(certValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("self-sign CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parse CA certificate: %w", err)
	}
	return &keyPair{cert: cert, der: der, key: key}, nil
}

// leafSpec describes a certificate to be signed by the CA.
type leafSpec struct {
	commonName   string
	organization []string // client certificates: Kubernetes maps O to groups
	usage        x509.ExtKeyUsage
	ips          []net.IP
	dnsNames     []string
}

// sign issues an ECDSA P-256 leaf certificate described by spec.
func (ca *keyPair) sign(spec leafSpec, now time.Time) (*keyPair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate key for %q: %w", spec.commonName, err)
	}
	sn, err := serialNumber()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: sn,
		Subject:      pkix.Name{CommonName: spec.commonName, Organization: spec.organization},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(certValidity),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  []x509.ExtKeyUsage{spec.usage},
		IPAddresses:  spec.ips,
		DNSNames:     spec.dnsNames,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return nil, fmt.Errorf("sign certificate %q: %w", spec.commonName, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parse certificate %q: %w", spec.commonName, err)
	}
	return &keyPair{cert: cert, der: der, key: key}, nil
}

// writeServiceAccountKeys generates the ECDSA P-256 key pair that
// kube-apiserver signs (private) and verifies (public) service account
// tokens with, writing the private key as "EC PRIVATE KEY" and the public
// key as PKIX "PUBLIC KEY".
func writeServiceAccountKeys(privPath, pubPath string) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("generate service account key: %w", err)
	}
	kb, err := ecKeyPEM(key)
	if err != nil {
		return err
	}
	if err := os.WriteFile(privPath, kb, 0o600); err != nil {
		return fmt.Errorf("write service account private key: %w", err)
	}
	pubDER, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return fmt.Errorf("marshal service account public key: %w", err)
	}
	pub := pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER})
	if err := os.WriteFile(pubPath, pub, 0o644); err != nil {
		return fmt.Errorf("write service account public key: %w", err)
	}
	return nil
}
