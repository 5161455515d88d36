//! Writes the pixels observation of each tabletop task (reset, then a few scripted steps) as
//! PNGs: `cargo run -p diffrl-tabletop --example camera_view -- OUT_DIR [SIZE]`.

use diffrl_core::Env;
use diffrl_tabletop::env::{ObsMode, Tabletop, TaskKind};
use diffrl_tabletop::expert::{ExpertConfig, TabletopExpert};

fn main() {
    let mut args = std::env::args().skip(1);
    let out = std::path::PathBuf::from(args.next().unwrap_or_else(|| "camera_view".into()));
    let size: u32 = args.next().and_then(|s| s.parse().ok()).unwrap_or(128);
    std::fs::create_dir_all(&out).expect("create the output folder");
    for kind in TaskKind::ALL {
        let mut env = Tabletop::builder()
            .kind(kind)
            .obs(ObsMode::Pixels)
            .image_size(size)
            .build()
            .expect("the shipped Panda loads");
        let mut expert = TabletopExpert::new(ExpertConfig::default(), 0);
        let mut obs = env.reset(1);
        for step in 0..=30 {
            if step % 15 == 0 {
                let image = obs.image.as_ref().expect("pixels observations have images");
                let path = out.join(format!("{}_{step:02}.png", kind.name()));
                image::RgbImage::from_raw(image.width, image.height, image.data.clone())
                    .expect("width * height * 3 bytes")
                    .save(&path)
                    .expect("write the PNG");
                println!("{}", path.display());
            }
            let a = expert.act(&env);
            match env.step(&a) {
                Ok(r) if !(r.terminated || r.truncated) => obs = r.obs,
                _ => break,
            }
        }
    }
}
