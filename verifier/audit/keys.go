package audit

import (
	"crypto/ed25519"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"os"
	"strings"
)

// ParsePublicKey reads a trusted Ed25519 public key: 64 hex digits, or a file holding them or
// a PEM (SubjectPublicKeyInfo) key. It returns the key as lowercase hex.
func ParsePublicKey(value string) (string, error) {
	text := strings.TrimSpace(value)
	if !isLowerHex(strings.ToLower(text), 64) {
		info, err := os.Stat(value)
		if err != nil || !info.Mode().IsRegular() {
			return "", fmt.Errorf("%s is neither 64 hex digits nor a readable key file", pyStringRepr(value))
		}
		content, err := os.ReadFile(value)
		if err != nil {
			return "", err
		}
		text = strings.TrimSpace(string(content))
		if strings.HasPrefix(text, "-----BEGIN") {
			return pemPublicKey(value, []byte(text))
		}
	}
	text = strings.ToLower(text)
	if !isLowerHex(text, 64) {
		return "", fmt.Errorf("%s: an Ed25519 public key is 64 hex digits (32 bytes)", pyStringRepr(value))
	}
	return text, nil
}

func pemPublicKey(path string, text []byte) (string, error) {
	block, _ := pem.Decode(text)
	if block == nil {
		return "", fmt.Errorf("%s: not a PEM public key", path)
	}
	key, err := x509.ParsePKIXPublicKey(block.Bytes)
	if err != nil {
		return "", fmt.Errorf("%s: %v", path, err)
	}
	edKey, ok := key.(ed25519.PublicKey)
	if !ok {
		return "", fmt.Errorf("%s: not an Ed25519 public key", path)
	}
	return hex.EncodeToString(edKey), nil
}

// signatureValid checks an Ed25519 signature given as 128 lowercase hex digits.
func signatureValid(publicKeyHex string, signature any, message []byte) bool {
	if !isLowerHex(signature, 128) {
		return false
	}
	key, err := hex.DecodeString(publicKeyHex)
	if err != nil || len(key) != ed25519.PublicKeySize {
		return false
	}
	raw, _ := hex.DecodeString(signature.(string))
	return ed25519.Verify(ed25519.PublicKey(key), message, raw)
}
