// The images of an image input, listed once: an image folder (torchvision's
// ImageFolder layout) or WebDataset-style tar shards. The image inputs of
// the trainer (open_images, data/dataset.h) and `perftrain extract` read
// them through this class.
//
// Contract:
// - ImageSet::open(path): a directory is an image folder: its sub-folders
//   are the classes, sorted by name (byte order, as Python's sorted) and
//   labelled 0..K-1; the images of a class are the files under its folder
//   (recursively, symbolic links followed) whose lower-cased name ends in one
//   of torchvision's IMG_EXTENSIONS (.jpg .jpeg .png .ppm .bmp .pgm .tif
//   .tiff .webp), ordered as torchvision orders them (folders by path, then
//   file names sorted). Names starting with '.' are skipped (files and
//   folders, classes too). .tif/.tiff/.webp files are refused at open, as is
//   an empty folder or a class folder with no image.
// - Anything else is a tar shard pattern (expand_braces in data/tar_file.h:
//   "shards-{000000..000009}.tar", "a.tar::b.tar"): each member
//   "<key>.<ext>" (key: the path up to the first '.' of the file name) is a
//   part of sample <key>; a sample is its image (ext jpg, jpeg or png, case
//   ignored) and its label (ext cls: a decimal integer >= 0, whitespace
//   around it allowed); other parts are ignored, and so are hidden members.
//   Samples come in shard order, then in the order their first part appears.
//   An image without .cls, a .cls without an image, two images of one key or
//   a .cls that is not a label is a UsageError naming the shard and the key;
//   classes are 0..max label.
// - Every open error is one line naming the file or folder; UsageError for
//   what the user can fix (paths, layout), RuntimeError for unreadable files.
// - item(i), read_bytes(i) and read_rgb(i) are safe from several threads;
//   read_rgb is read_bytes decoded by decode_image (data/image_file.h):
//   uint8 [H, W, 3], errors naming item(i).source.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace perftrain::data {

struct ImageItem {
  std::string source;  // the file, or "<shard.tar>:<member>"
  int64_t label = 0;
};

class ImageSet {
 public:
  static ImageSet open(const std::string& path);

  int64_t size() const { return static_cast<int64_t>(items_.size()); }
  const ImageItem& item(int64_t i) const { return items_.at(static_cast<size_t>(i)); }
  const std::vector<ImageItem>& items() const { return items_; }
  int64_t num_classes() const { return static_cast<int64_t>(class_names_.size()); }
  // The folder's class names; for tar shards the labels' decimal text.
  const std::vector<std::string>& class_names() const { return class_names_; }
  bool is_folder() const { return shards_.empty(); }
  // The encoded bytes of image i.
  std::vector<uint8_t> read_bytes(int64_t i) const;
  // Image i decoded: uint8 [H, W, 3].
  at::Tensor read_rgb(int64_t i) const;
  // "image folder <path>" or "N tar shards <pattern>", for messages.
  std::string describe() const;

 private:
  struct Location {  // where a tar sample's image lies
    int32_t shard = -1;
    int64_t offset = 0, size = 0;
    std::string member;
  };
  std::string path_;
  std::vector<ImageItem> items_;
  std::vector<std::string> class_names_;
  std::vector<std::string> shards_;    // empty for a folder
  std::vector<Location> locations_;    // per item, for tar shards

  static ImageSet open_folder(const std::string& path);
  static ImageSet open_shards(const std::string& pattern);
};

}  // namespace perftrain::data
